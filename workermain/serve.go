package workermain

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/server/lifecycle"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/server/opshttp"
	"github.com/jetflow/jetflow/internal/tracing/otlp"
)

// startTimeout bounds one attempt of the worker's Start: provisioning of
// its streams, buckets and consumers. An attempt that fails transiently
// (NATS or JetStream not serving yet) is followed by another. With
// --apply-ack-wait an attempt is not bounded: lowering the deployment's
// AckWait waits out a grace that grows with the AckWait it lowers from
// (each request of the start is bounded by itself).
const startTimeout = 30 * time.Second

// serve wires the worker over ws and runs it until ctx ends (or the
// operations server fails), then drains. p.ready, if not nil, is called
// once the worker is serving.
//
// The operations server comes first: /healthz answers from the start, and
// /readyz says what the worker waits for until it serves. An external NATS
// that is not reachable yet, or whose JetStream does not answer yet, is
// waited for (natsconn.Wait: each attempt logged at warn), so that an
// orchestrator that starts NATS and the workers at once sees a live
// worker that is not ready, instead of one that exits. Credentials the
// server refuses, TLS that cannot be agreed on, and errors that trying
// again does not fix stop the command.
func (p *program) serve(ctx context.Context, ws *jetflow.Registry, cfg config, log zerolog.Logger) error {
	natsOpts := cfg.NATS
	if cfg.embedded() {
		srv, err := natsserver.Start(natsserver.Config{
			DataDir: cfg.DataDir, Host: cfg.Host, Port: cfg.Port, SyncAlways: cfg.SyncAlways,
		})
		if errors.Is(err, natsserver.ErrPortInUse) {
			return fmt.Errorf("%w; choose another port with --port (JETFLOW_PORT, or port: in the config file; -1 picks a free one), "+
				"or join the server there with --nats-url nats://%s", err, net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
		}
		if err != nil {
			return err
		}
		defer func() {
			srv.Shutdown()
			log.Info().Msg("embedded NATS server stopped")
		}()
		natsOpts.URL = srv.ClientURL()
		log.Info().Str("url", natsOpts.URL).Str("data_dir", cfg.DataDir).Bool("sync_always", cfg.SyncAlways).
			Msg("embedded NATS server started")
	}

	var (
		ops     net.Listener
		reg     *prometheus.Registry
		metrics *jetflow.Metrics
		err     error
	)
	if cfg.OpsAddr != "" {
		reg = opshttp.NewRegistry()
		if metrics, err = jetflow.NewMetrics(reg); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		if ops, err = opshttp.Listen(cfg.OpsAddr); err != nil {
			return err
		}
		defer ops.Close() // Serve closes it too; this covers a failure before Serve
	}

	// The operations server runs from here (live, not ready) until after
	// the drain (not ready while stopping); if it fails, the worker drains
	// and stops with its error.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var (
		worker  atomic.Pointer[jetflow.Worker]
		waiting natsconn.Waiting
		h       http.Handler
		opsURL  string
	)
	if ops != nil {
		h = opshttp.Handler(reg, opshttp.Check{Name: "worker", Fn: func(ctx context.Context) error {
			if w := worker.Load(); w != nil {
				return w.Ready(ctx)
			}
			if w := waiting.String(); w != "" {
				return errors.New(w)
			}
			return errors.New("starting")
		}})
	}
	srv := lifecycle.ServeOps(ctx, ops, h, func(err error) { fail(fmt.Errorf("operations server: %w", err)) })
	defer srv.Stop()
	if ops != nil {
		opsURL = "http://" + ops.Addr().String()
		log.Info().Str("url", opsURL).Msg("operations server started: /metrics /healthz /readyz")
	}
	// stopped is what serve returns when the worker did not get to serve:
	// err, or, when ctx ended first, nothing (a signal) or the operations
	// server's failure, which Stop returns.
	stopped := func(err error) error {
		if ctx.Err() != nil {
			err = nil
		}
		return errors.Join(err, srv.Stop())
	}

	url := natsconn.Redact(natsOpts.URL)
	nc, err := natsconn.Wait(ctx, url, log, &waiting, func(context.Context) (*nats.Conn, error) {
		return natsOpts.Connect("jetflow-"+p.name, append(natsconn.LogEvents(log), nats.Timeout(5*time.Second))...)
	})
	if err != nil {
		return stopped(err)
	}
	defer nc.Close()
	log.Info().Str("url", nc.ConnectedUrlRedacted()).Bool("tls", nc.TLSRequired()).Int("replicas", cfg.Replicas).
		Msg("connected to NATS")

	if p.setup != nil {
		closeSetup, err := p.setup(ctx, Setup{Logger: log, Conn: nc})
		if err != nil {
			return errors.Join(err, srv.Stop())
		}
		if closeSetup != nil {
			defer closeSetup()
		}
	}

	tp, stopTracing, err := otlp.Setup(ctx, p.getenv, "jetflow-"+p.name, log)
	if err != nil {
		return errors.Join(err, srv.Stop())
	}
	defer stopTracing() // after the drain: the last steps' and runs' spans are flushed
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Concurrency: cfg.Concurrency, AckWait: cfg.AckWait, ApplyAckWait: cfg.ApplyAckWait, Logger: log, Metrics: metrics,
		Tracing:       jetflow.WithTracerProvider(tp),
		SweepInterval: cfg.SweepInterval, StuckAfter: cfg.StuckAfter,
		Build: cfg.Build, CheckBeforeServing: cfg.CheckBeforeServing,
		Topology: cfg.topology(),
	})
	if err != nil {
		return errors.Join(err, srv.Stop())
	}
	// Each attempt is bounded (startTimeout); one that fails because NATS
	// or JetStream cannot serve it now (jetflow.ErrUnavailable, or a
	// request nobody answered) is followed by another.
	_, err = natsconn.Wait(ctx, url, log, &waiting, func(ctx context.Context) (struct{}, error) {
		var (
			startCtx context.Context
			cancel   context.CancelFunc
		)
		if cfg.ApplyAckWait {
			startCtx, cancel = context.WithCancel(ctx)
		} else {
			startCtx, cancel = context.WithTimeout(ctx, startTimeout)
		}
		defer cancel()
		err := w.Start(startCtx)
		// Workers of an earlier engine version are running, or this code
		// would block runs in flight (--check-before-serving): wait
		// (unready, saying so) until they are stopped, or the runs have
		// ended, as for NATS itself.
		switch {
		case errors.Is(err, jetflow.ErrEngineMismatch):
			err = natsconn.WaitingFor("workers of another engine protocol to stop", err)
		case errors.Is(err, jetflow.ErrWouldBlock):
			err = natsconn.WaitingFor("the runs in flight this build would block to end (--check-before-serving)", err)
		case err != nil && (!jetstream.IsTransient(err) || nc.IsClosed()):
			err = natsconn.Permanent(err) // a closed connection does not come back
		}
		return struct{}{}, err
	})
	if err != nil {
		return stopped(natsconn.Cause(err))
	}
	worker.Store(w)

	if p.ready != nil {
		p.ready(Endpoints{NatsURL: natsOpts.URL, OpsURL: opsURL})
	}

	<-ctx.Done()
	log.Info().Str("drain_timeout", logging.Duration(cfg.DrainTimeout)).Msg("stopping: finishing running steps")
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	return errors.Join(stopError(w.Stop(drainCtx), cfg.DrainTimeout), srv.Stop())
}

// stopError words the worker's Stop error: only a drain that ran out of
// --drain-timeout left steps unfinished, to run again elsewhere; any other
// error says nothing of the steps (nil stays nil).
func stopError(err error, drainTimeout time.Duration) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("drain: %w (after --drain-timeout %s; unfinished steps will run again, with the same step IDs)", err, logging.Duration(drainTimeout))
	default:
		return fmt.Errorf("stop: %w", err)
	}
}
