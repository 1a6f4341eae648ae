package ordertests_test

import (
	"context"
	"errors"
	"flag"
	"path/filepath"
	"testing"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/jetflowtest"
)

var update = flag.Bool("update", false, "record testdata/order-o-9.json again")

// golden is an order's history as the shipped order workflow made it.
var golden = filepath.Join("testdata", "order-o-9.json")

// TestOrderReplaysItsGoldenHistory: the order workflow as it is now
// replays the history of an order recorded when it shipped, so a deploy
// of it leaves the orders in flight intact (go test -update records the
// history again, for a new version).
func TestOrderReplaysItsGoldenHistory(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	if *update {
		h := jetflowtest.Start(s.env, s.wf, input("o-9"), jetflow.WithRunID("order-o-9"))
		s.deliver(t, "order-o-9")
		ctx, cancel := s.env.Background()
		defer cancel()
		if _, err := h.Result(ctx); err != nil {
			t.Fatal(err)
		}
		if err := jetflowtest.WriteHistory(golden, s.env.History("order-o-9")); err != nil {
			t.Fatal(err)
		}
	}
	h, err := jetflowtest.ReadHistory(golden)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Steps) != orders.StepCount {
		t.Fatalf("the golden history holds %d steps, want %d", len(h.Steps), orders.StepCount)
	}
	if err := jetflowtest.Replay(s.wf, h); err != nil {
		t.Fatalf("the order workflow no longer replays %s: %v", golden, err)
	}
}

// TestRenamedChargeStepIsCaught: a version of the order workflow whose
// charge step got a new name would charge the orders in flight again under
// a new Idempotency-Key; the replay check reports it before it ships.
func TestRenamedChargeStepIsCaught(t *testing.T) {
	t.Parallel()
	h, err := jetflowtest.ReadHistory(golden)
	if err != nil {
		t.Fatal(err)
	}
	changed := jetflow.NewWorkflow(orders.WorkflowName, func(ctx *jetflow.Context, in orders.OrderInput) (orders.OrderResult, error) {
		if _, err := jetflow.Step(ctx, orders.StepReserve, func(context.Context) (string, error) { return "", nil }); err != nil {
			return orders.OrderResult{}, err
		}
		_, err := jetflow.Step(ctx, "charge-card", func(context.Context) (orders.ChargeResult, error) {
			return orders.ChargeResult{}, nil
		})
		return orders.OrderResult{}, err
	})
	var d *jetflowtest.DivergenceError
	if err := jetflowtest.Replay(changed, h); !errors.As(err, &d) || d.Kind != jetflowtest.Renamed || d.History.Name != orders.StepCharge {
		t.Fatalf("Replay = %v, want the renamed charge step reported", err)
	}
}
