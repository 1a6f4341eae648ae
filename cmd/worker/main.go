// Command worker runs the jetflow example workflows (package
// examples/orders) with the example payment service they call.
//
// It is the worker command of package workermain, which documents its
// flags, configuration, operations endpoints and exit codes (go doc
// ./workermain), over the order workflow, plus two flags of its own:
// --payments-addr, where the example payment service listens, and
// --flaky-charge, which loses the payment service's first response to show
// a safe retry. With no flags it starts an embedded NATS server on
// 127.0.0.1:4222 (data in ./jetflow-data), so that producers and more
// workers can connect to it, and serves until SIGINT or SIGTERM.
//
// A worker of your own is the same main over your workflows; see
// examples/customworker.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/natsconn"
	"github.com/jetflow/jetflow/workermain"
)

func main() {
	ws := jetflow.NewRegistry()
	os.Exit(workermain.Main(ws, (&demo{ws: ws}).options()...))
}

// demo is the example's part of the command: the payment service the
// order workflow calls, started once the flags are read, and the order
// workflow added to ws then.
type demo struct {
	ws           *jetflow.Registry
	paymentsAddr string
	flakyCharge  bool
	log          zerolog.Logger
	pay          *orders.PaymentService
	// onReady, if not nil, is called once the worker serves (tests).
	onReady func(workermain.Endpoints)
}

func (d *demo) options() []workermain.Option {
	return []workermain.Option{
		workermain.WithDescription("Runs the jetflow example workflows."),
		workermain.WithFlags(func(fs *flag.FlagSet) {
			fs.StringVar(&d.paymentsAddr, "payments-addr", "127.0.0.1:0", "example payment service: `address` to listen on")
			fs.BoolVar(&d.flakyCharge, "flaky-charge", false, "example order workflow: lose the payment service's first response, to show a safe retry")
		}),
		workermain.WithSetup(d.setup),
		workermain.WithReady(func(ep workermain.Endpoints) {
			logHints(d.log, natsconn.Redact(ep.NatsURL), d.pay.URL())
			if d.onReady != nil {
				d.onReady(ep)
			}
		}),
	}
}

// setup starts the payment service and adds the order workflow.
func (d *demo) setup(_ context.Context, s workermain.Setup) (func(), error) {
	d.log = s.Logger
	pay, err := orders.StartPaymentService(d.paymentsAddr, s.Logger.With().Str("component", "payments").Logger())
	if err != nil {
		return nil, err
	}
	d.pay = pay
	s.Logger.Info().Str("url", pay.URL()).Bool("flaky_charge", d.flakyCharge).Msg("example payment service started")
	err = d.ws.Register(orders.NewOrderWorkflow(orders.NewPaymentClient(pay.URL(), nil),
		orders.OrderOptions{FlakyAfterCharge: d.flakyCharge}))
	if err != nil {
		pay.Close()
		return nil, err
	}
	return func() { pay.Close() }, nil
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
