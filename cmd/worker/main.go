// Command worker runs the jetflow example workflows.
//
// With no flags it starts an embedded NATS server with JetStream on
// 127.0.0.1:4222 (data in ./jetflow-data), so that producers and more
// workers can connect to it, plus the example payment service, and serves
// until SIGINT or SIGTERM. It then stops taking work, lets running steps
// finish for up to --drain-timeout, and shuts down. A second signal exits at
// once. With --nats-url it connects to an existing NATS deployment instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/jetstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one kills the process.
	context.AfterFunc(ctx, stop)
	zerolog.TimeFieldFormat = time.RFC3339Nano
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr *os.File) int {
	cfg, err := parseConfig(args, getenv, isTerminal(stderr), stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return 1
	}
	log := newLogger(cfg, stderr)
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
}

// serve wires the worker and runs it until ctx ends, then drains. ready, if
// not nil, is called once the worker is serving.
func serve(ctx context.Context, cfg config, log zerolog.Logger, ready func(endpoints)) error {
	url := cfg.NatsURL
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
		url = srv.ClientURL()
		log.Info().Str("url", url).Str("data_dir", cfg.DataDir).Bool("sync_always", cfg.SyncAlways).
			Msg("embedded NATS server started")
	}

	nc, err := jetstream.Connect(url, "jetflow-worker",
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil { // closed by us
				return
			}
			log.Warn().Err(err).Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info().Str("url", c.ConnectedUrlRedacted()).Msg("reconnected to NATS")
		}),
	)
	if err != nil {
		return err
	}
	defer nc.Close()

	pay, err := orders.StartPaymentService(cfg.PaymentsAddr, log.With().Str("component", "payments").Logger())
	if err != nil {
		return err
	}
	defer pay.Close()
	log.Info().Str("url", pay.URL()).Bool("flaky_charge", cfg.FlakyCharge).Msg("example payment service started")

	ws := jetflow.NewWorkers()
	err = ws.Add(orders.NewOrderWorkflow(orders.NewPaymentClient(pay.URL(), nil),
		orders.OrderOptions{FlakyAfterCharge: cfg.FlakyCharge}))
	if err != nil {
		return err
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Concurrency: cfg.Concurrency, AckWait: cfg.AckWait, Logger: log,
	})
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = w.Start(startCtx)
	cancel()
	if err != nil {
		return err
	}

	logHints(log, url, pay.URL())
	if ready != nil {
		ready(endpoints{NatsURL: url, PaymentsURL: pay.URL()})
	}

	<-ctx.Done()
	log.Info().Dur("drain_timeout", cfg.DrainTimeout).Msg("stopping: finishing running steps")
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := w.Stop(drainCtx); err != nil {
		return fmt.Errorf("drain: %w (unfinished steps will run again, with the same step IDs)", err)
	}
	return nil
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

func newLogger(cfg config, w *os.File) zerolog.Logger {
	var out io.Writer = w
	if cfg.LogFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !isTerminal(w)}
	}
	return zerolog.New(out).Level(cfg.LogLevel).With().Timestamp().Logger()
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
