package jetflow_test

import (
	"context"
	"fmt"

	"github.com/jetflow/jetflow"
)

// Finding runs by business attributes: the run ID is the provider's event
// ID, the operator is asked about order 42. (The example's worker serves
// another workflow: fulfil's runs stay running, in the order they were
// started.)
func Example_findRunsByAttributes() {
	fulfil := jetflow.NewWorkflow("fulfil", func(ctx *jetflow.Context, ev StripeEvent) (string, error) {
		return "fulfilled " + ev.ID, nil
	})
	other := jetflow.NewWorkflow("other", func(ctx *jetflow.Context, n int) (int, error) { return n, nil })
	c, stop := exampleEnv(other)
	defer stop()
	ctx := context.Background()

	for _, ev := range []struct{ id, order string }{{"evt_1", "41"}, {"evt_2", "42"}, {"evt_3", "42"}} {
		h, err := jetflow.Start(ctx, c, fulfil, StripeEvent{ID: ev.id}, jetflow.WithRunID("stripe-"+ev.id),
			jetflow.WithAttributes(map[string]string{"order_id": ev.order, "customer": "7"}))
		if err != nil {
			panic(err)
		}
		fmt.Println(h.RunID, h.Outcome)
	}
	page, err := c.ListRuns(ctx, jetflow.ListOptions{Attributes: map[string]string{"order_id": "42"}, Status: jetflow.StatusRunning})
	if err != nil {
		panic(err)
	}
	for _, r := range page.Runs { // newest first
		fmt.Println(r.RunID, r.Status, r.Attributes["order_id"], r.Attributes["customer"])
	}
	_, err = jetflow.Start(ctx, c, fulfil, StripeEvent{ID: "evt_4"}, jetflow.WithRunID("stripe-evt_4"),
		jetflow.WithAttributes(map[string]string{"Order ID": "43"}))
	fmt.Println(err)
	// Output:
	// stripe-evt_1 created
	// stripe-evt_2 created
	// stripe-evt_3 created
	// stripe-evt_3 running 42 7
	// stripe-evt_2 running 42 7
	// jetflow: invalid attributes: attribute name "Order ID": want [a-z][a-z0-9_]{0,31}
}
