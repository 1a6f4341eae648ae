package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// bundle is one test's embedded NATS server, payment service, worker
// serving the order workflow, and client.
type bundle struct {
	pay    *PaymentService
	wf     *jetflow.Workflow[OrderInput, OrderResult]
	client *jetflow.Client
}

func setup(t *testing.T, opts OrderOptions) *bundle {
	t.Helper()
	srv := testenv.Server(t)

	pay := startPayments(t)
	wf := NewOrderWorkflow(NewPaymentClient(pay.URL(), nil), opts)

	wnc := testenv.Conn(t, srv)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(wf))
	w, err := jetflow.NewWorker(wnc, ws, jetflow.WorkerConfig{
		Logger: testenv.Logger(t),
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctxT(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})

	cnc := testenv.Conn(t, srv)
	c, err := jetflow.NewClient(ctxT(t, 10*time.Second), cnc, jetflow.ClientConfig{})
	require.NoError(t, err)
	return &bundle{pay: pay, wf: wf, client: c}
}

func testOrder() OrderInput {
	return OrderInput{OrderID: "o-42", AmountCents: 1999, Currency: "usd", Email: "ada@example.com"}
}

func TestOrderCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})

	h, err := jetflow.Start(ctxT(t, 10*time.Second), b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-1"))
	require.NoError(t, err)
	require.Equal(t, jetflow.OutcomeCreated, h.Outcome)

	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, OrderResult{
		OrderID: "o-42", ChargeID: "ch_1", ReservationID: "rsv_o-42",
		ReceiptID: "msg_1", ShipmentID: "shp_1", Delivery: "reminder sent",
	}, out)
	require.Equal(t, 1, b.pay.Charges())
	require.Equal(t, 1, b.pay.Requests("order-o-1.charge.0"))
	requireOnceEach(t, b.pay, "order-o-1")

	steps := requireSteps(t, b.client, "order-o-1", StepRemind)
	for i := range 4 {
		require.Equal(t, 1, steps[i].Attempt)
	}
	require.JSONEq(t, `{"charge_id":"ch_1","idempotency_key":"order-o-1.charge.0","replayed":false}`, string(steps[1].Output))
	require.Equal(t, "event", steps[4].Kind)
	require.NotEmpty(t, steps[4].Error, "no carrier event came: the wait holds its timeout")
	require.Empty(t, steps[4].EventID)
}

// requireSteps: the run committed StepCount steps, in this order: the
// four of the order, the wait for the carrier's event, and last.
func requireSteps(t *testing.T, c *jetflow.Client, runID, last string) []jetflow.StepRecord {
	t.Helper()
	steps, err := c.Steps(ctxT(t, 5*time.Second), runID)
	require.NoError(t, err)
	var ids []string
	for _, s := range steps {
		ids = append(ids, s.StepID)
	}
	want := []string{runID + "." + StepReserve + ".0", runID + "." + StepCharge + ".0", runID + "." + StepReceipt + ".0",
		runID + "." + StepShip + ".0", runID + ".event=" + EventDelivered + ".0", runID + "." + last + ".0"}
	require.Len(t, want, StepCount)
	require.ElementsMatch(t, want, ids)
	byID := make(map[string]jetflow.StepRecord, len(steps))
	for _, s := range steps {
		byID[s.StepID] = s
	}
	out := make([]jetflow.StepRecord, len(want))
	for i, id := range want {
		out[i] = byID[id]
	}
	return out
}

// TestCarrierEventConfirmsDelivery: the carrier's event, sent as soon as
// the run exists (before the run reaches its wait, or while it waits), is
// kept and confirms the delivery; no reminder is sent. The same event
// again is a duplicate while the run is still going, and ErrRunEnded once
// it has completed; either way nothing changes.
func TestCarrierEventConfirmsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})
	ctx := ctxT(t, 20*time.Second)

	h, err := jetflow.Start(ctx, b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-5"))
	require.NoError(t, err)
	payload := json.RawMessage(`{"carrier":"ups"}`)
	res, err := b.client.SendEvent(ctx, "order-o-5", EventDelivered, "dlv-o-5", payload)
	require.NoError(t, err)
	require.Equal(t, jetflow.EventDelivered, res.Outcome)
	require.Equal(t, "order-o-5.event="+EventDelivered+".0", res.StepID)
	res, err = b.client.SendEvent(ctx, "order-o-5", EventDelivered, "dlv-o-5", payload)
	require.NoError(t, err)
	require.Equal(t, jetflow.EventDuplicate, res.Outcome)

	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "delivered by ups", out.Delivery)
	steps := requireSteps(t, b.client, "order-o-5", StepConfirm)
	require.Equal(t, "event", steps[4].Kind)
	require.Equal(t, "dlv-o-5", steps[4].EventID)
	require.JSONEq(t, string(payload), string(steps[4].Output))
	requireOnceEach(t, b.pay, "order-o-5")

	// After the run ended: the carrier's redelivery is still a duplicate,
	// a new event is refused.
	res, err = b.client.SendEvent(ctx, "order-o-5", EventDelivered, "dlv-o-5", payload)
	require.NoError(t, err)
	require.Equal(t, jetflow.EventDuplicate, res.Outcome)
	_, err = b.client.SendEvent(ctx, "order-o-5", EventDelivered, "dlv-o-5-late", payload)
	require.ErrorIs(t, err, jetflow.ErrRunEnded)
}

// TestChargeRetriedAfterLostResponseChargesOnce: the first attempt of the
// charge step makes the charge and then fails, as if the response had been
// lost. The retry sends the same step ID as Idempotency-Key, so the payment
// service replays the charge instead of making a second one.
func TestChargeRetriedAfterLostResponseChargesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{FlakyAfterCharge: true})

	h, err := jetflow.Start(ctxT(t, 10*time.Second), b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-2"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "ch_1", out.ChargeID)

	charge := requireSteps(t, b.client, "order-o-2", StepRemind)[1]
	require.Equal(t, "order-o-2.charge.0", charge.StepID)
	require.Equal(t, 2, charge.Attempt, "the charge step ran twice")
	require.JSONEq(t, `{"charge_id":"ch_1","idempotency_key":"order-o-2.charge.0","replayed":true}`, string(charge.Output))

	require.Equal(t, 2, b.pay.Requests("order-o-2.charge.0"), "both attempts reached the payment service")
	require.Equal(t, 1, b.pay.Charges(), "but it charged once")
	requireOnceEach(t, b.pay, "order-o-2")
}

// TestDuplicateStartChargesOnce: a webhook delivered twice starts one run.
func TestDuplicateStartChargesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})
	ctx := ctxT(t, 10*time.Second)

	first, err := jetflow.Start(ctx, b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-3"))
	require.NoError(t, err)
	require.Equal(t, jetflow.OutcomeCreated, first.Outcome)
	second, err := jetflow.Start(ctx, b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-3"))
	require.NoError(t, err)
	require.Equal(t, jetflow.OutcomeExisting, second.Outcome)
	require.Equal(t, int64(1), second.Duplicates)

	out1, err := first.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	out2, err := second.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, out1, out2)

	// A re-delivery after the run completed still lands on it.
	third, err := jetflow.Start(ctx, b.client, b.wf, testOrder(), jetflow.WithRunID("order-o-3"))
	require.NoError(t, err)
	require.Equal(t, jetflow.OutcomeExisting, third.Outcome)
	require.Equal(t, jetflow.StatusCompleted, third.Status)
	require.Equal(t, int64(2), third.Duplicates)

	require.Equal(t, 1, b.pay.Charges())
	requireOnceEach(t, b.pay, "order-o-3")
}

// requireOnceEach: the runs made exactly their side effects, each once:
// one charge, one receipt email and one shipment per run, each under its
// step's ID, and nothing else.
func requireOnceEach(t *testing.T, pay *PaymentService, runIDs ...string) {
	t.Helper()
	var charges, emails, shipments []string
	for _, id := range runIDs {
		charges = append(charges, id+"."+StepCharge+".0")
		emails = append(emails, id+"."+StepReceipt+".0")
		shipments = append(shipments, id+"."+StepShip+".0")
	}
	require.Equal(t, len(charges), pay.Charges(), "one charge per run")
	for _, key := range charges {
		require.Equal(t, 1, pay.ChargesFor(key), "charged under %s", key)
	}
	require.ElementsMatch(t, emails, pay.Emails.Keys(), "one receipt email per run, under its step ID")
	require.ElementsMatch(t, shipments, pay.Shipments.Keys(), "one shipment per run, under its step ID")
}

// TestParallelSideEffectsOncePerRun: orders started twice each, all at
// once; every run sends one receipt and books one
// shipment, the two steps running in parallel after the charge.
func TestParallelSideEffectsOncePerRun(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})
	const n = 8
	ids := make([]string, n)
	handles := make(chan *jetflow.Handle[OrderResult], 2*n)
	var wg sync.WaitGroup
	for i := range n {
		in := testOrder()
		in.OrderID = fmt.Sprintf("p-%d", i)
		ids[i] = "order-" + in.OrderID
		for range 2 {
			wg.Go(func() {
				h, err := jetflow.Start(ctxT(t, 10*time.Second), b.client, b.wf, in, jetflow.WithRunID(ids[i]))
				if !assert.NoError(t, err) {
					return
				}
				handles <- h
			})
		}
	}
	wg.Wait()
	close(handles)
	require.Len(t, handles, 2*n)
	created := 0
	for h := range handles {
		if h.Outcome == jetflow.OutcomeCreated {
			created++
		}
		out, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err)
		require.Equal(t, h.RunID, "order-"+out.OrderID)
		require.NotEmpty(t, out.ReceiptID)
		require.NotEmpty(t, out.ShipmentID)
	}
	require.Equal(t, n, created, "one run per order")
	requireOnceEach(t, b.pay, ids...)
}

// TestInvalidOrderFailsBeforeCharging: the workflow validates its input
// before any step, so a bad order fails its run and charges nothing.
func TestInvalidOrderFailsBeforeCharging(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})

	bad := testOrder()
	bad.AmountCents = 0
	h, err := jetflow.Start(ctxT(t, 10*time.Second), b.client, b.wf, bad, jetflow.WithRunID("order-o-4"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.ErrorIs(t, err, jetflow.ErrRunFailed)
	var runErr *jetflow.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, jetflow.StatusFailed, runErr.Status)
	require.Contains(t, runErr.Message, "amount_cents must be positive")
	require.Zero(t, b.pay.Charges())
}

// TestOrderRequiresRunID: the order workflow refuses a generated run ID,
// which no retry could repeat, and stores nothing.
func TestOrderRequiresRunID(t *testing.T) {
	t.Parallel()
	b := setup(t, OrderOptions{})
	ctx := ctxT(t, 10*time.Second)

	_, err := jetflow.Start(ctx, b.client, b.wf, testOrder(), jetflow.WithGeneratedRunID())
	require.ErrorIs(t, err, jetflow.ErrRunIDRequired)
	in, err := json.Marshal(testOrder())
	require.NoError(t, err)
	_, err = b.client.StartByName(ctx, WorkflowName, in, jetflow.WithGeneratedRunID())
	require.ErrorIs(t, err, jetflow.ErrRunIDRequired)

	page, err := b.client.ListRuns(ctx, jetflow.ListOptions{Workflow: WorkflowName})
	require.NoError(t, err)
	require.Empty(t, page.Runs)
	require.Zero(t, b.pay.Charges())
}
