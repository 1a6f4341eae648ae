package jetflow_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
)

type OrderInput struct {
	OrderID     string `json:"order_id"`
	AmountCents int    `json:"amount_cents"`
}

type Receipt struct {
	ChargeKey string `json:"charge_key"`
}

// A workflow whose charge step passes its step ID as the Idempotency-Key,
// started twice under one run ID: one run, the second start is absorbed.
func Example() {
	dir, _ := os.MkdirTemp("", "jetflow-example")
	defer os.RemoveAll(dir)
	srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect("example")
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	order := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, in OrderInput) (Receipt, error) {
		key, err := jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepInfo(sctx)
			// Call the payment API here with Idempotency-Key: info.StepID.
			return info.StepID, nil
		})
		return Receipt{ChargeKey: key}, err
	})

	ws := jetflow.NewWorkers()
	if err := ws.Add(order); err != nil {
		panic(err)
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer w.Stop(ctx)

	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	if err != nil {
		panic(err)
	}
	in := OrderInput{OrderID: "o-1", AmountCents: 1999}
	first, err := jetflow.Start(ctx, c, order, in, jetflow.WithRunID("stripe-evt_123"))
	if err != nil {
		panic(err)
	}
	again, err := jetflow.Start(ctx, c, order, in, jetflow.WithRunID("stripe-evt_123"))
	if err != nil {
		panic(err)
	}
	receipt, err := again.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(first.Outcome, again.Outcome, again.Duplicates)
	fmt.Println(receipt.ChargeKey)
	// Output:
	// created existing 1
	// stripe-evt_123.charge.0
}
