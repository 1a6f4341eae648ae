package jetflow_test

import (
	"context"
	"fmt"

	"github.com/jetflow/jetflow"
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
	order := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, in OrderInput) (Receipt, error) {
		key, err := jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			// Call the payment API here with Idempotency-Key: info.StepID.
			return info.StepID, nil
		})
		return Receipt{ChargeKey: key}, err
	})
	c, stop := exampleEnv(order) // an embedded nats-server and a worker serving order
	defer stop()
	ctx := context.Background()

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
