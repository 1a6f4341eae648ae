// Package orders is an example of what jetflow is for: an order workflow
// whose charge step is safe to retry because it passes its step ID as the
// Idempotency-Key of the payment API. Once charged, the order's receipt
// email and its shipping are two steps that run in parallel (jetflow.Go,
// jetflow.AwaitAll), each passing its own step ID as the Idempotency-Key
// of its provider. Then the order waits for the carrier's webhook event
// (EventDelivered, sent to the run with Client.SendEvent, producer send or
// POST /v1/runs/{id}/events/carrier-delivered) for DeliveryWait at most: if
// it comes, a confirm-delivery step records it; if not, a send-reminder
// step runs. While it waits the run holds no worker, goroutine or timer in
// memory: the timeout is a message the NATS server keeps.
//
// Start a run with the order's own ID in the run ID ("order-o-1"): however
// often the start is retried or re-delivered, there is one run, and the
// run's charge step, however often it is retried or redelivered after a
// crash, makes one charge.
//
// The order workflow is defined with jetflow.RequireRunID: a start that
// asks for a generated run ID (producer start --generate-id, HTTP
// ?generate_run_id=true) is refused with jetflow.ErrRunIDRequired (HTTP
// 400) and stores nothing. A generated ID is new on every call, so a
// client that retries after a lost answer would start, and charge, the
// order a second time; only an ID the caller derives from the order makes
// the retry land on the first run.
//
// The payment service (PaymentService) runs in the worker's process for
// tests and for "go run ./cmd/worker", or as a process of its own,
// "go run ./examples/orders/payments", whose ledger survives the worker's
// crashes. crash-demo.sh in this directory SIGKILLs a worker twice while
// orders are charged and shows one charge per order.
package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow"
)

// WorkflowName is the order workflow's stable name.
const WorkflowName = "order"

// Step names of the order workflow. With the run ID they make the step IDs,
// such as "order-o-1.charge.0". The body starts them in this order, so
// their IDs are the same on every replay; the last two run in parallel.
const (
	StepReserve = "reserve-inventory"
	StepCharge  = "charge"
	StepReceipt = "send-receipt"
	StepShip    = "book-shipping"
	// StepConfirm runs when the carrier's event came in time, StepRemind
	// when it did not.
	StepConfirm = "confirm-delivery"
	StepRemind  = "send-reminder"
)

// EventDelivered is the carrier's webhook event: the parcel arrived. Its
// payload is a CarrierDelivered.
const EventDelivered = "carrier-delivered"

// DeliveryWait is how long an order waits for EventDelivered before it
// sends a reminder. A real shop would wait days; the demo waits seconds.
const DeliveryWait = 2 * time.Second

// StepCount is how many steps a completed order run has committed: the
// first four above, the wait for EventDelivered (step ID
// "<run>.event=carrier-delivered.0", holding the event or the timeout),
// and one of StepConfirm or StepRemind.
const StepCount = 6

// CarrierDelivered is the payload of the carrier's EventDelivered.
type CarrierDelivered struct {
	Carrier string `json:"carrier"`
}

// OrderInput is what the webhook handler passes to the workflow.
type OrderInput struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Email       string `json:"email"`
}

// OrderResult is the workflow's output.
type OrderResult struct {
	OrderID       string `json:"order_id"`
	ChargeID      string `json:"charge_id"`
	ReservationID string `json:"reservation_id"`
	// ReceiptID is the receipt email's ID, ShipmentID the shipment's, as
	// their providers answered.
	ReceiptID  string `json:"receipt_id"`
	ShipmentID string `json:"shipment_id"`
	// Delivery is what became of the shipping: "delivered by <carrier>"
	// (StepConfirm's result) or "reminder sent" (StepRemind's).
	Delivery string `json:"delivery"`
}

// ChargeResult is the charge step's committed result.
type ChargeResult struct {
	ChargeID       string `json:"charge_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Replayed is true when the payment service answered with a charge it
	// had already made under the key: a retry after a lost response.
	Replayed bool `json:"replayed"`
}

// OrderOptions tune the example.
type OrderOptions struct {
	// FlakyAfterCharge makes the first attempt of the charge step fail with
	// a retryable error after the payment service has accepted the charge,
	// as when the response is lost on the way back. The retry sends the
	// same Idempotency-Key and gets the same charge back.
	FlakyAfterCharge bool
}

// errLostResponse is the fault FlakyAfterCharge injects.
var errLostResponse = errors.New("connection reset after the charge was accepted (simulated lost response)")

// NewOrderWorkflow defines the order workflow, charging through pay. It
// requires a caller-chosen run ID (jetflow.RequireRunID; see the package
// doc).
func NewOrderWorkflow(pay *PaymentClient, opts OrderOptions) *jetflow.Workflow[OrderInput, OrderResult] {
	// Short backoffs keep the demo quick; real payment calls would wait longer.
	backoff := jetflow.WithBackoff(200*time.Millisecond, 2*time.Second)

	return jetflow.NewWorkflow(WorkflowName, func(ctx *jetflow.Context, in OrderInput) (OrderResult, error) {
		if err := in.validate(); err != nil {
			return OrderResult{}, err
		}

		reservation, err := jetflow.Step(ctx, StepReserve, func(context.Context) (string, error) {
			// A real inventory service would take the step ID as its
			// idempotency key too; this one just names the reservation.
			return "rsv_" + in.OrderID, nil
		}, backoff)
		if err != nil {
			return OrderResult{}, err
		}

		charge, err := jetflow.Step(ctx, StepCharge, func(sctx context.Context) (ChargeResult, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			ch, replayed, err := pay.Charge(sctx, info.StepID, ChargeRequest{
				OrderID: in.OrderID, AmountCents: in.AmountCents, Currency: in.Currency,
				Metadata: ChargeMetadata{Workflow: info.Workflow},
			})
			if err != nil {
				return ChargeResult{}, err
			}
			if opts.FlakyAfterCharge && info.Attempt == 1 {
				return ChargeResult{}, jetflow.Retryable(fmt.Errorf("charge %s: %w", ch.ID, errLostResponse))
			}
			return ChargeResult{ChargeID: ch.ID, IdempotencyKey: info.StepID, Replayed: replayed}, nil
		}, backoff)
		if err != nil {
			return OrderResult{}, err
		}

		// The receipt and the shipping do not depend on each other: start
		// both, then wait for both. Each runs as a task of its own, on any
		// worker, and no worker is held while the body waits.
		receipt := jetflow.Go(ctx, StepReceipt, func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			e, _, err := pay.SendReceipt(sctx, info.StepID, ReceiptRequest{
				To: in.Email, OrderID: in.OrderID, ChargeID: charge.ChargeID,
				AmountCents: in.AmountCents, Currency: in.Currency,
			})
			return e.ID, err
		}, backoff)
		shipment := jetflow.Go(ctx, StepShip, func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			e, _, err := pay.BookShipment(sctx, info.StepID, ShipmentRequest{OrderID: in.OrderID, ReservationID: reservation})
			return e.ID, err
		}, backoff)
		if err := jetflow.AwaitAll(ctx, receipt, shipment); err != nil {
			return OrderResult{}, err
		}
		receiptID, err := receipt.Get(ctx)
		if err != nil {
			return OrderResult{}, err
		}
		shipmentID, err := shipment.Get(ctx)
		if err != nil {
			return OrderResult{}, err
		}

		// Wait for the carrier's webhook, or DeliveryWait. An event sent
		// before the body gets here is kept and returned at once; sending it
		// again with the same event ID is a duplicate and changes nothing.
		delivery, err := awaitDelivery(ctx, backoff)
		if err != nil {
			return OrderResult{}, err
		}

		return OrderResult{
			OrderID: in.OrderID, ChargeID: charge.ChargeID, ReservationID: reservation,
			ReceiptID: receiptID, ShipmentID: shipmentID, Delivery: delivery,
		}, nil
	}, jetflow.RequireRunID(), jetflow.WithEvent[CarrierDelivered](EventDelivered))
}

// awaitDelivery waits for EventDelivered at most DeliveryWait, then runs
// StepConfirm with the carrier's event, or StepRemind when the wait timed
// out, and returns that step's result.
func awaitDelivery(ctx *jetflow.Context, opts ...jetflow.StepOption) (string, error) {
	ev, err := jetflow.WaitEvent[CarrierDelivered](ctx, EventDelivered, jetflow.WithTimeout(DeliveryWait))
	switch {
	case errors.Is(err, jetflow.ErrEventTimeout):
		return jetflow.Step(ctx, StepRemind, func(context.Context) (string, error) {
			// A real shop would email the customer here, with the step ID
			// as the email provider's Idempotency-Key.
			return "reminder sent", nil
		}, opts...)
	case err != nil:
		return "", err
	}
	return jetflow.Step(ctx, StepConfirm, func(context.Context) (string, error) {
		return "delivered by " + ev.Carrier, nil
	}, opts...)
}

// validate is deterministic, so the workflow body may call it: a bad order
// fails the run before any step runs.
func (in OrderInput) validate() error {
	switch {
	case in.OrderID == "":
		return errors.New("order_id is required")
	case in.AmountCents <= 0:
		return fmt.Errorf("order %s: amount_cents must be positive, got %d", in.OrderID, in.AmountCents)
	case len(in.Currency) != 3:
		return fmt.Errorf("order %s: currency must be a 3-letter code, got %q", in.OrderID, in.Currency)
	case in.Email == "":
		return fmt.Errorf("order %s: email is required", in.OrderID)
	}
	return nil
}
