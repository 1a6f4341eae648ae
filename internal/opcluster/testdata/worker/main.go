// Command worker is the worker process of the operated-cluster test
// (package opcluster): the example order workflow (examples/orders) over
// workermain, charging through the payment service at --payments-url, which
// the test runs in its own process so that every charge any worker makes is
// counted in one place, per Idempotency-Key.
//
// cmd/worker starts a payment service inside each worker process instead
// (--payments-addr), whose counts die with the process: a test that kills
// workers needs the counter outside them.
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/workermain"
)

func main() {
	ws := jetflow.NewRegistry()
	var paymentsURL string
	os.Exit(workermain.Main(ws,
		workermain.WithName("opcluster-worker"),
		workermain.WithDescription("Runs the example order workflow against an external payment service (the operated-cluster test)."),
		workermain.WithFlags(func(fs *flag.FlagSet) {
			fs.StringVar(&paymentsURL, "payments-url", "", "base URL of the payment service the charge step calls (required)")
		}),
		workermain.WithSetup(func(context.Context, workermain.Setup) (func(), error) {
			if paymentsURL == "" {
				return nil, errors.New("--payments-url is required")
			}
			return nil, ws.Register(orders.NewOrderWorkflow(orders.NewPaymentClient(paymentsURL, nil), orders.OrderOptions{}))
		}),
	))
}
