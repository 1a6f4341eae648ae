// Command worker runs the jetflow example workflows (package
// examples/orders) and calls the example payment service they charge
// through.
//
// It is the worker command of package workermain, which documents its
// flags, configuration, operations endpoints and exit codes (go doc
// ./workermain), over the order workflow, plus flags of its own:
//
//   - --payments-url: the payment service to charge through, such as one
//     started with "go run ./examples/orders/payments", whose ledger
//     outlives this process;
//   - --payments-addr: without --payments-url, the worker starts the
//     example payment service in its own process, listening there (a crash
//     of the worker then loses its ledger);
//   - --flaky-charge: lose the payment service's first response, to show a
//     safe retry.
//
// With no flags it starts an embedded NATS server on 127.0.0.1:4222 (data
// in ./jetflow-data), so that producers and more workers can connect to it,
// and the payment service in-process on a random port, and serves until
// SIGINT or SIGTERM.
//
// A worker of your own is the same main over your workflows; see
// examples/customworker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/workermain"
)

func main() {
	ws := jetflow.NewRegistry()
	os.Exit(workermain.Main(ws, (&demo{ws: ws}).options()...))
}

// demo is the example's part of the command: the payment service the
// order workflow calls, found or started once the flags are read, and the
// order workflow added to ws then.
type demo struct {
	ws           *jetflow.Registry
	paymentsURL  string // the flag, then the URL charged through
	paymentsAddr string
	flakyCharge  bool
	log          zerolog.Logger
	// onReady, if not nil, is called once the worker serves (tests).
	onReady func(workermain.Endpoints)
}

func (d *demo) options() []workermain.Option {
	return []workermain.Option{
		workermain.WithDescription("Runs the jetflow example workflows."),
		workermain.WithFlags(func(fs *flag.FlagSet) {
			fs.StringVar(&d.paymentsURL, "payments-url", "", "example payment service to charge through, a `URL` (go run ./examples/orders/payments); empty: start one in this process")
			fs.StringVar(&d.paymentsAddr, "payments-addr", "127.0.0.1:0", "without --payments-url: `address` the in-process example payment service listens on")
			fs.BoolVar(&d.flakyCharge, "flaky-charge", false, "example order workflow: lose the payment service's first response, to show a safe retry")
		}),
		workermain.WithSetup(d.setup),
		workermain.WithReady(func(ep workermain.Endpoints) {
			logHints(d.log, natsconn.Redact(ep.NatsURL), d.paymentsURL)
			if d.onReady != nil {
				d.onReady(ep)
			}
		}),
	}
}

// setup starts the in-process payment service unless --payments-url names
// one, and adds the order workflow charging through it.
func (d *demo) setup(_ context.Context, s workermain.Setup) (func(), error) {
	d.log = s.Logger
	closePay := func() {}
	if d.paymentsURL != "" {
		if err := checkPaymentsURL(d.paymentsURL); err != nil {
			return nil, err
		}
	} else {
		pay, err := orders.StartPaymentService(orders.PaymentOptions{
			Addr: d.paymentsAddr, Log: s.Logger.With().Str("component", "payments").Logger(),
		})
		if err != nil {
			return nil, err
		}
		d.paymentsURL = pay.URL()
		closePay = func() {
			if err := pay.Close(); err != nil {
				s.Logger.Error().Err(err).Msg("example payment service: close")
			}
		}
		s.Logger.Info().Str("url", d.paymentsURL).Msg("example payment service started in this process")
	}
	s.Logger.Info().Str("payments_url", d.paymentsURL).Bool("flaky_charge", d.flakyCharge).Msg("order workflow charges through the example payment service")
	err := d.ws.Register(orders.NewOrderWorkflow(orders.NewPaymentClient(d.paymentsURL, nil),
		orders.OrderOptions{FlakyAfterCharge: d.flakyCharge}))
	if err != nil {
		closePay()
		return nil, err
	}
	return closePay, nil
}

// checkPaymentsURL refuses a --payments-url that is not an http(s) URL
// with a host, so that a typo fails the start instead of every charge.
func checkPaymentsURL(raw string) error {
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "") {
		err = errors.New("want http://host:port")
	}
	if err != nil {
		return fmt.Errorf("invalid value %q for --payments-url: %w", raw, err)
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
		producer + " start order " + input + " --id order-o-1",
		producer + " start order " + input + " --id order-o-1   # again: existing run",
		producer + " wait order-o-1",
		producer + " get order-o-1",
		"curl -s " + paymentsURL + "/charges",
	} {
		log.Info().Msg("try: " + hint)
	}
}
