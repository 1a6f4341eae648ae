package ordertests_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/jetflowtest"
)

// TestMain fails the package when a test leaves goroutines behind.
func TestMain(m *testing.M) { jetflowtest.Main(m) }

// shop is one test's order workflow, its payment service and its Env.
type shop struct {
	env *jetflowtest.Env
	pay *orders.PaymentService
	wf  *jetflow.Workflow[orders.OrderInput, orders.OrderResult]
}

func newShop(t *testing.T) *shop {
	t.Helper()
	pay, err := orders.StartPaymentService(orders.PaymentOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pay.Close(); err != nil {
			t.Error(err)
		}
	})
	wf := orders.NewOrderWorkflow(orders.NewPaymentClient(pay.URL(), nil), orders.OrderOptions{})
	return &shop{env: jetflowtest.New(t, wf), pay: pay, wf: wf}
}

func input(id string) orders.OrderInput {
	return orders.OrderInput{OrderID: id, AmountCents: 4200, Currency: "EUR", Email: "ada@example.com"}
}

// deliver sends the carrier's event to the order's run, as the carrier's
// webhook would; the run keeps it until its body waits for it.
func (s *shop) deliver(t *testing.T, runID string) {
	t.Helper()
	if _, err := s.env.SendEvent(runID, orders.EventDelivered, "dhl-1", orders.CarrierDelivered{Carrier: "DHL"}); err != nil {
		t.Fatal(err)
	}
}

// crashedOrder runs the order id with the crash point armed: the worker
// crashes once, and the carrier's event goes to the fresh worker (a request
// the dying worker received would not be answered).
func (s *shop) crashedOrder(t *testing.T, id string) orders.OrderResult {
	t.Helper()
	h := jetflowtest.Start(s.env, s.wf, input(id), jetflow.WithRunID("order-"+id))
	s.env.AwaitCrashes(1)
	s.deliver(t, "order-"+id)
	ctx, cancel := s.env.Background()
	defer cancel()
	res, err := h.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.env.Crashes() != 1 {
		t.Fatalf("%d crashes, want 1", s.env.Crashes())
	}
	return res
}

func TestOrderCompletes(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	h := jetflowtest.Start(s.env, s.wf, input("o-1"), jetflow.WithRunID("order-o-1"))
	s.deliver(t, "order-o-1")
	ctx, cancel := s.env.Background()
	defer cancel()
	res, err := h.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Delivery != "delivered by DHL" || res.ChargeID == "" {
		t.Fatalf("result %+v", res)
	}

	// A retried start is the same run, and says so in its audit.
	if again, err := jetflowtest.Run(s.env, s.wf, input("o-1"), jetflow.WithRunID("order-o-1")); err != nil || again != res {
		t.Fatalf("retried start = %+v, %v; want the first run's %+v", again, err, res)
	}
	r := s.env.Inspect("order-o-1")
	if r.Run.Duplicates != 1 || len(r.Steps) != orders.StepCount {
		t.Fatalf("run: %d duplicates, %d steps %v; want 1 and %d", r.Run.Duplicates, len(r.Steps), r.StepNames(), orders.StepCount)
	}
	charge, ok := r.Step(orders.StepCharge)
	if !ok || charge.StepID != "order-o-1.charge.0" || charge.Attempt != 1 {
		t.Fatalf("charge step %+v", charge)
	}
	if n := s.pay.ChargesFor(charge.StepID); n != 1 {
		t.Fatalf("%d charges under %s, want 1", n, charge.StepID)
	}
	// The wait for the carrier holds the event it received.
	wait, ok := r.Step("event=" + orders.EventDelivered)
	if !ok || wait.Kind != "event" || wait.EventID != "dhl-1" {
		t.Fatalf("carrier wait %+v, want the event dhl-1", wait)
	}
}

// A worker that dies after the charge is committed and before its task is
// acknowledged: the fresh worker replays the committed charge and never
// calls the payment service again.
func TestCrashAfterChargeCommitsChargesOnce(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	s.env.CrashAfterCommit(orders.StepCharge)
	s.crashedOrder(t, "o-2")
	key := "order-o-2.charge.0"
	if req, n := s.pay.Requests(key), s.pay.ChargesFor(key); req != 1 || n != 1 {
		t.Fatalf("payment service: %d requests, %d charges under %s; want 1 and 1", req, n, key)
	}
}

// A worker that dies in the middle of the charge, after the payment
// service took it: the fresh worker charges again under the same
// Idempotency-Key, and the payment service answers with the first charge.
func TestCrashDuringChargeChargesOnce(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	s.env.CrashDuringStep(orders.StepCharge)
	res := s.crashedOrder(t, "o-3")
	key := "order-o-3.charge.0"
	if req, n := s.pay.Requests(key), s.pay.ChargesFor(key); req != 2 || n != 1 {
		t.Fatalf("payment service: %d requests, %d charges under %s; want 2 and 1", req, n, key)
	}
	charge, _ := s.env.Inspect("order-o-3").Step(orders.StepCharge)
	out, err := jetflowtest.Output[orders.ChargeResult](charge)
	if err != nil || !out.Replayed || out.ChargeID != res.ChargeID || charge.Attempt != 2 {
		t.Fatalf("charge committed at attempt %d as %+v (%v); want attempt 2, the replayed charge %s", charge.Attempt, out, err, res.ChargeID)
	}
}

// A stubbed payment call declines the card: the order fails with the
// step's error, and nothing is shipped.
func TestDeclinedChargeFailsTheOrder(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	jetflowtest.Stub(s.env, orders.StepCharge, func(context.Context) (orders.ChargeResult, error) {
		return orders.ChargeResult{}, jetflow.ErrorWithCode("card_declined", jetflow.Fatal(errors.New("card declined")))
	})
	_, err := jetflowtest.Run(s.env, s.wf, input("o-4"), jetflow.WithRunID("order-o-4"))
	var re *jetflow.RunError
	if !errors.As(err, &re) || re.Code != "card_declined" {
		t.Fatalf("err = %v, want the run error with code card_declined", err)
	}
	r := s.env.Inspect("order-o-4")
	if _, shipped := r.Step(orders.StepShip); shipped || s.pay.Charges() != 0 {
		t.Fatalf("steps %v, %d charges: a declined order must not ship or charge", r.StepNames(), s.pay.Charges())
	}
}

// An order whose carrier never reports delivery: once the test moves the
// Env's time past the carrier wait, the wait times out and the order sends
// a reminder, without waiting DeliveryWait (days, in a real shop) in real
// time.
func TestUndeliveredOrderGetsAReminder(t *testing.T) {
	t.Parallel()
	s := newShop(t)
	h := jetflowtest.Start(s.env, s.wf, input("o-5"), jetflow.WithRunID("order-o-5"))
	timer := s.env.WaitTimer("order-o-5") // the order waits for the carrier
	if want := "order-o-5.event=" + orders.EventDelivered + ".0"; timer.StepID != want {
		t.Fatalf("timer of step %s, want the carrier wait %s", timer.StepID, want)
	}
	fired := s.env.Advance(orders.DeliveryWait)
	ctx, cancel := s.env.Background()
	defer cancel()
	res, err := h.Result(ctx)
	if err != nil || res.Delivery != "reminder sent" {
		t.Fatalf("Result = %+v, %v; want the reminder", res, err)
	}
	t.Logf("the Advance fired %d timer(s)", fired)
}
