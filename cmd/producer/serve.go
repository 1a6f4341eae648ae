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

// serve runs producer serve until ctx is done: the HTTP API under /v1/, the
// web inspector under /ui/ (/ redirects to it), and /metrics, /healthz and
// /readyz (ready when the client can reach NATS and the engine's buckets)
// on one address. It then stops accepting, lets
// in-flight requests finish (opshttp.ShutdownTimeout) and returns nil.
// getenv resolves the webhook sources' secret_env. ready, if not nil, is
// called with the bound address once the listener is bound. It returns the
// first error that keeps it from serving.
func serve(ctx context.Context, c cli, getenv func(string) string, log zerolog.Logger, ready func(addr string)) error {
	var sources []webhook.Source
	if c.serve.webhooks != "" {
		var err error
		if sources, err = loadWebhooks(c.serve.webhooks, getenv); err != nil {
			return err
		}
	}

	nc, err := c.nats.Connect("jetflow-producer", append(natsconn.LogEvents(log), nats.Timeout(5*time.Second))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	log.Info().Str("url", nc.ConnectedUrlRedacted()).Bool("tls", nc.TLSRequired()).Msg("connected to NATS")

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
	client, err := newClient(ctx, nc, c, jetflow.ClientConfig{Metrics: metrics, RequestTimeout: c.serve.requestTimeout,
		Tracing: jetflow.WithTracerProvider(tp)})
	if err != nil {
		return err
	}
	// apiCtx ends on SIGTERM, or when the operations server fails: the API
	// then drains (long polls answer at once) while the operations
	// endpoints stay up, not ready, until it is done.
	apiCtx, stopAPI := context.WithCancel(ctx)
	defer stopAPI()
	api, err := httpapi.New(httpapi.Config{
		Backend:        client,
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
		Backend:        client,
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
		{Name: "jetflow", Fn: client.Ready},
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
	ev := log.Info().Str("addr", ln.Addr().String()).Bool("auth", len(c.serve.tokens) > 0).Strs("webhook_sources", names)
	if opsLn == nil {
		ev.Msg("serving the API on /v1/ and /metrics /healthz /readyz")
	} else {
		ev.Str("ops_addr", opsLn.Addr().String()).Msg("serving the API on /v1/, and /metrics /healthz /readyz on ops_addr")
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
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
	log.Info().Msg("stopped")
	return nil
}
