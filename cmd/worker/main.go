// Command worker runs the jetflow example workflows.
//
// With no flags it starts an embedded NATS server with JetStream on
// 127.0.0.1:4222 (data in ./jetflow-data), so that producers and more
// workers can connect to it, plus the example payment service, and serves
// until SIGINT or SIGTERM. It then stops taking work, lets running steps
// finish for up to --drain-timeout, and shuts down. A second signal exits at
// once.
//
// # Connecting to NATS
//
// With --nats-url it joins an existing NATS deployment instead, optionally
// authenticating with --nats-user and --nats-password, --nats-token,
// --nats-nkey or --nats-creds, and using TLS with --nats-tls-ca (and
// --nats-tls-cert and --nats-tls-key where the server verifies clients).
// Those flags are refused with the embedded server, which has neither.
// --replicas 3 replicates the engine's streams and buckets on a three-node
// cluster; every worker and producer of a deployment must agree on it.
//
// # Configuration
//
// Each flag is read from the command line, else from JETFLOW_<FLAG>
// (--ack-wait from JETFLOW_ACK_WAIT), else from the YAML file named by
// --config or JETFLOW_CONFIG (keys are flag names), else its default.
// --print-config prints the effective settings as such a file, with where
// each came from, secrets redacted, and exits.
//
// # Operations
//
// --ops-addr (default 127.0.0.1:8081, empty disables) serves Prometheus
// metrics on /metrics, liveness on /healthz and readiness on /readyz (the
// worker is started, connected, and its streams, buckets and consumers are
// in place).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/natsconn"
	"github.com/jetflow/jetflow/internal/opshttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one kills the process.
	context.AfterFunc(ctx, stop)
	zerolog.TimeFieldFormat = time.RFC3339Nano
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, stderr *os.File) int {
	cfg, err := parseConfig(args, getenv, logging.IsTerminal(stderr), stdout, stderr)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errConfigPrinted) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return 1
	}
	log := logging.New(stderr, cfg.LogFormat, cfg.LogLevel)
	if err := serve(ctx, cfg, log, nil); err != nil {
		log.Error().Err(err).Msg("worker failed")
		return 1
	}
	return 0
}

// endpoints are the addresses a started worker serves on.
type endpoints struct {
	NatsURL     string
	PaymentsURL string
	// OpsURL is the operations server's base URL, empty when disabled.
	OpsURL string
}

// serve wires the worker and runs it until ctx ends (or the operations
// server fails), then drains. ready, if not nil, is called once the worker
// is serving.
func serve(ctx context.Context, cfg config, log zerolog.Logger, ready func(endpoints)) error {
	natsOpts := cfg.NATS
	if cfg.embedded() {
		srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{
			DataDir: cfg.DataDir, Host: cfg.Host, Port: cfg.Port, SyncAlways: cfg.SyncAlways,
		})
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

	nc, err := natsOpts.Connect("jetflow-worker", natsconn.LogEvents(log)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	log.Info().Str("url", nc.ConnectedUrlRedacted()).Bool("tls", nc.TLSRequired()).Int("replicas", cfg.Replicas).
		Msg("connected to NATS")

	var (
		ops     net.Listener
		reg     *prometheus.Registry
		metrics *jetflow.Metrics
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

	pay, err := orders.StartPaymentService(cfg.PaymentsAddr, log.With().Str("component", "payments").Logger())
	if err != nil {
		return err
	}
	defer pay.Close()
	log.Info().Str("url", pay.URL()).Bool("flaky_charge", cfg.FlakyCharge).Msg("example payment service started")

	ws := jetflow.NewRegistry()
	err = ws.Register(orders.NewOrderWorkflow(orders.NewPaymentClient(pay.URL(), nil),
		orders.OrderOptions{FlakyAfterCharge: cfg.FlakyCharge}))
	if err != nil {
		return err
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Concurrency: cfg.Concurrency, AckWait: cfg.AckWait, ApplyAckWait: cfg.ApplyAckWait, Logger: log, Metrics: metrics,
		SweepInterval: cfg.SweepInterval, StuckAfter: cfg.StuckAfter,
		Topology: jetflow.Topology{Replicas: cfg.Replicas},
	})
	if err != nil {
		return err
	}

	// The operations server runs from before Start (live, not ready) until
	// after the drain (not ready while stopping); if it fails, the worker
	// drains and stops with its error.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOps()
	opsDone := make(chan error, 1)
	opsURL := ""
	if ops != nil {
		opsURL = "http://" + ops.Addr().String()
		h := opshttp.Handler(reg, opshttp.Check{Name: "worker", Fn: w.Ready})
		go func() {
			err := opshttp.Serve(opsCtx, ops, h)
			if err != nil {
				fail(fmt.Errorf("operations server: %w", err))
			}
			opsDone <- err
		}()
		log.Info().Str("url", opsURL).Msg("operations server started: /metrics /healthz /readyz")
	} else {
		opsDone <- nil
	}

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = w.Start(startCtx)
	cancel()
	if err != nil {
		stopOps()
		return errors.Join(err, <-opsDone)
	}

	logHints(log, natsOpts.Redacted(), pay.URL())
	if ready != nil {
		ready(endpoints{NatsURL: natsOpts.URL, PaymentsURL: pay.URL(), OpsURL: opsURL})
	}

	<-ctx.Done()
	log.Info().Dur("drain_timeout", cfg.DrainTimeout).Msg("stopping: finishing running steps")
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	var drainErr error
	if err := w.Stop(drainCtx); err != nil {
		drainErr = fmt.Errorf("drain: %w (unfinished steps will run again, with the same step IDs)", err)
	}
	stopOps()
	opsErr := <-opsDone
	return errors.Join(drainErr, opsErr)
}

// logHints tells a first-time user what to try next.
func logHints(log zerolog.Logger, natsURL, paymentsURL string) {
	producer := "go run ./cmd/producer"
	if natsURL != "nats://127.0.0.1:4222" {
		producer += " --nats-url " + natsURL
	}
	const input = `'{"order_id":"o-1","amount_cents":1999,"currency":"usd","email":"ada@example.com"}'`
	for _, hint := range []string{
		producer + " start order " + input + " --id stripe-evt_123",
		producer + " start order " + input + " --id stripe-evt_123   # again: existing run",
		producer + " wait stripe-evt_123",
		producer + " get stripe-evt_123",
		"curl -s " + paymentsURL + "/charges",
	} {
		log.Info().Msg("try: " + hint)
	}
}
