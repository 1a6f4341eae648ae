package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	imetrics "github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/inspector"
	"github.com/jetflow/jetflow/internal/server/lifecycle"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/server/opshttp"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/tracing/otlp"
)

// serveHooks let a test follow serve. listening is called with the API's
// bound address once its listeners are bound, before NATS is reached (the
// API answers 503 until then); ready with the same address once serve is
// connected and its client bound (the API serves). Either may be nil.
type serveHooks struct {
	listening, ready func(addr string)
}

// serve runs producer serve until ctx is done: the HTTP API under /v1/, the
// web inspector under /ui/ (/ redirects to it), and /metrics, /healthz and
// /readyz on one address. It then stops accepting, lets in-flight requests
// finish (opshttp.ShutdownTimeout) and returns nil. getenv resolves the
// webhook sources' secret_env. It returns the first error that keeps it
// from serving.
//
// It serves before NATS is reachable: the listeners are bound first, and
// NATS is dialled in the background until it answers (pendingClient.connect:
// a backoff up to natsconn.RetryMax, each attempt logged "waiting for NATS
// at <url>"), so that a producer started before NATS, or while it
// restarts, waits for it instead of exiting. Until connected, /healthz
// answers 200 (alive), /readyz 503 (its check "jetflow" says what it waits
// for) and the API 503 with Retry-After; readiness afterwards is the
// client's (Client.Ready: connected, the engine's buckets answer). serve
// gives up only on a setting that cannot be used, credentials the server
// refuses or TLS that cannot be agreed on (natsconn.IsPermanent), or when ctx ends.
func serve(ctx context.Context, c cli, getenv func(string) string, log zerolog.Logger, hooks serveHooks) error {
	var sources []webhook.Source
	if c.serve.webhooks != "" {
		var err error
		if sources, err = loadWebhooks(c.serve.webhooks, getenv); err != nil {
			return err
		}
	}
	// A setting that cannot be used fails now, not after binding.
	if _, err := c.nats.NATSOptions(); err != nil {
		return err
	}

	reg := opshttp.NewRegistry()
	metrics, err := jetflow.NewClientMetrics(reg) // no worker series: the producer is no worker
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	observeHTTP, err := imetrics.HTTPObserver(reg) // the HTTP series of metrics
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	tp, stopTracing, err := otlp.Setup(ctx, getenv, "jetflow-producer", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	backend := &pendingClient{}
	// apiCtx ends on SIGTERM, when the operations server fails, or when
	// NATS cannot be reached for good: the API then drains (long polls
	// answer at once) while the operations endpoints stay up, not ready,
	// until it is done.
	apiCtx, stopAPI := context.WithCancel(ctx)
	defer stopAPI()
	api, err := httpapi.New(httpapi.Config{
		Backend:        backend,
		Tokens:         c.serve.tokens,
		Sources:        sources,
		RequestTimeout: c.serve.requestTimeout,
		Observe:        observeHTTP,
		Stopping:       apiCtx,
		Logger:         log.With().Str("component", "httpapi").Logger(),
	})
	if err != nil {
		return err
	}
	ui, err := inspector.New(inspector.Config{
		Backend:        backend,
		Tokens:         c.serve.tokens,
		RequestTimeout: c.serve.requestTimeout,
		Logger:         log.With().Str("component", "inspector").Logger(),
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", httpapi.RequestLog(api, log.With().Str("component", "httpapi").Logger()))
	inspector.Register(mux, ui) // the web inspector on /ui/, and / redirecting to it
	checks := []opshttp.Check{
		{Name: "jetflow", Fn: backend.Ready},
		{Name: "serving", Fn: func(context.Context) error {
			if apiCtx.Err() != nil {
				return errors.New("shutting down")
			}
			return nil
		}},
	}
	var opsLn net.Listener // a separate operations listener (--ops-addr)
	if c.serve.opsAddr == "" {
		opshttp.Register(mux, reg, checks...)
	} else if opsLn, err = opshttp.Listen(c.serve.opsAddr); err != nil {
		return err
	}

	ln, err := opshttp.Listen(c.serve.httpAddr)
	if err != nil {
		if opsLn != nil {
			err = errors.Join(err, opsLn.Close())
		}
		return err
	}
	names := make([]string, len(sources))
	for i, s := range sources {
		names[i] = s.Name
	}
	addrs := func(e *zerolog.Event) *zerolog.Event {
		e = e.Str("addr", ln.Addr().String())
		if opsLn != nil {
			e = e.Str("ops_addr", opsLn.Addr().String())
		}
		return e
	}
	url := c.nats.Redacted()
	addrs(log.Info()).Str("url", url).Msg("listening; not ready until connected to NATS")
	if hooks.listening != nil {
		hooks.listening(ln.Addr().String())
	}

	// NATS is dialled in the background while the listeners serve.
	var (
		nc *nats.Conn
		// failed is the error that made NATS unusable for good, nil when
		// dialling ended with the shutdown.
		failed    error
		connected = make(chan struct{})
	)
	defer func() {
		stopAPI()   // ends the dialling, if serve returns before it is over
		<-connected // the dialling is over once serve returns
		if nc != nil {
			nc.Close()
		}
	}()
	go func() {
		defer close(connected)
		var err error
		nc, err = backend.connect(apiCtx, url, log, func(ctx context.Context) (*nats.Conn, *jetflow.Client, error) {
			conn, err := c.nats.Connect("jetflow-producer", append(natsconn.LogEvents(log), nats.Timeout(5*time.Second))...)
			if err != nil {
				return nil, nil, err
			}
			log.Info().Str("url", conn.ConnectedUrlRedacted()).Bool("tls", conn.TLSRequired()).Msg("connected to NATS")
			client, err := newClient(ctx, conn, c, jetflow.ClientConfig{Metrics: metrics, RequestTimeout: c.serve.requestTimeout,
				Tracing: jetflow.WithTracerProvider(tp)})
			if err != nil {
				conn.Close()
				return nil, nil, fmt.Errorf("bind the engine's streams and buckets: %w", err)
			}
			return conn, client, nil
		})
		if err != nil {
			if apiCtx.Err() == nil { // a failure for good, not the shutdown
				failed = err // logged by the caller
			}
			stopAPI()
			return
		}
		addrs(log.Info()).Bool("auth", len(c.serve.tokens) > 0).Strs("webhook_sources", names).
			Msg("serving the API on /v1/ and /metrics /healthz /readyz")
		if hooks.ready != nil {
			hooks.ready(ln.Addr().String())
		}
	}()

	// Starts and reads in flight at shutdown may take their request
	// timeout (twice: a long poll reads before and after its wait).
	grace := 2*c.serve.requestTimeout + 5*time.Second
	if opsLn == nil {
		if err := opshttp.ServeGrace(apiCtx, ln, mux, grace); err != nil {
			return fmt.Errorf("http server: %w", err)
		}
	} else {
		ops := lifecycle.ServeOps(ctx, opsLn, opshttp.Handler(reg, checks...), func(error) {
			stopAPI() // the API does not outlive its operations endpoints
		})
		defer ops.Stop()
		err := opshttp.ServeGrace(apiCtx, ln, mux, grace)
		// Stopped after the API's drain: its last counters can be scraped until then.
		if err = errors.Join(err, ops.Stop()); err != nil {
			return fmt.Errorf("http server: %w", err)
		}
	}
	<-connected
	if failed != nil {
		return failed
	}
	log.Info().Msg("stopped")
	return nil
}
