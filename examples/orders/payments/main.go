// Command payments runs the example payment service of package
// examples/orders as a process of its own, so that its ledger outlives the
// workers that charge through it:
//
//	go run ./examples/orders/payments --addr 127.0.0.1:8099 --ledger jetflow-data/payments.jsonl
//	go run ./cmd/worker --payments-url http://127.0.0.1:8099
//
// It serves POST /charges (honouring Idempotency-Key), GET /charges and
// GET /charges/count, and the order workflow's email and shipping
// providers (POST and GET /emails and /shipments, kept in memory only),
// until SIGINT or SIGTERM, and logs one JSON line per
// charge request, with the run ID and workflow it came from, to stderr.
// With --ledger every charge is appended to that file (its directory is
// created if missing) before it is answered and read back on start, so a
// restarted service still replays a charge instead of making it twice.
// Exit code 0 after a signal, 1 on a usage error or when the ledger cannot
// be read or the address cannot be bound.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/examples/orders"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run serves the payment service as args say until ctx is done, logging to
// stderr, and returns the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8099", "address to listen on")
	ledger := fs.String("ledger", "", "file to keep the charges in across restarts (empty: in memory only)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "payments: unexpected arguments %q\n", fs.Args())
		return 1
	}
	log := zerolog.New(stderr).With().Timestamp().Logger()
	pay, err := orders.StartPaymentService(orders.PaymentOptions{Addr: *addr, Ledger: *ledger, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "payments: %v\n", err)
		return 1
	}
	c := pay.Count()
	log.Info().Str("url", pay.URL()).Str("ledger", *ledger).Int("charges", c.Charges).Msg("payment service started")
	<-ctx.Done()
	if err := pay.Close(); err != nil {
		log.Error().Err(err).Msg("payment service: close")
		return 1
	}
	log.Info().Msg("payment service stopped")
	return 0
}
