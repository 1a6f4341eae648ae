package jetflow_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/embedded"
)

type OrderInput struct {
	OrderID     string `json:"order_id"`
	AmountCents int    `json:"amount_cents"`
}

type Receipt struct {
	ChargeKey string `json:"charge_key"`
}

// A workflow whose charge step passes its step ID as the Idempotency-Key,
// started twice under one run ID, the order's own (a run ID names one
// intent: charge this order): one run, the second start is absorbed.
// Everything runs in the process: an embedded NATS server, a worker and a
// client.
func Example() {
	order := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, in OrderInput) (Receipt, error) {
		key, err := jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			// Call the payment API here with Idempotency-Key: info.StepID.
			return info.StepID, nil
		})
		return Receipt{ChargeKey: key}, err
	})
	ctx := context.Background()

	// NATS with JetStream, in the process; its data in a directory of ours.
	dir, err := os.MkdirTemp("", "jetflow-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: dir, Port: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := jetflow.Connect(srv.ClientURL()) // the settings jetflow needs
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	// A worker serving the workflow, stopped (drained) at the end.
	ws := jetflow.NewRegistry()
	if err := ws.Register(order); err != nil {
		log.Fatal(err)
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		// Stop drains with a deadline of its own: a context that is
		// already done (a cancelled ctx at shutdown) would drain nothing.
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.Stop(stopCtx); err != nil {
			log.Print(err)
		}
	}()

	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	in := OrderInput{OrderID: "o-1", AmountCents: 1999}
	first, err := jetflow.Start(ctx, c, order, in, jetflow.WithRunID("order-"+in.OrderID))
	if err != nil {
		log.Fatal(err)
	}
	again, err := jetflow.Start(ctx, c, order, in, jetflow.WithRunID("order-"+in.OrderID))
	if err != nil {
		log.Fatal(err)
	}
	receipt, err := again.Result(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Outcome, again.Outcome, again.Duplicates)
	fmt.Println(receipt.ChargeKey)
	// Output:
	// created existing 1
	// order-o-1.charge.0
}
