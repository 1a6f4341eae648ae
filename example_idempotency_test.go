package jetflow_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
)

// exampleEnv runs an embedded nats-server and a worker for the examples of
// docs/idempotency.md. stop shuts everything down.
func exampleEnv(wfs ...jetflow.Registrable) (c *jetflow.Client, stop func()) {
	dir, err := os.MkdirTemp("", "jetflow-example")
	if err != nil {
		panic(err)
	}
	srv, err := natsserver.Start(natsserver.Config{DataDir: dir, Port: -1})
	if err != nil {
		panic(err)
	}
	nc, err := jetstream.Connect(srv.ClientURL(), "example")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := jetflow.NewRegistry()
	if err := ws.Register(wfs...); err != nil {
		panic(err)
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	c, err = jetflow.NewClient(ctx, nc, jetflow.ClientConfig{Name: "example"})
	if err != nil {
		panic(err)
	}
	return c, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
		nc.Close()
		srv.Shutdown()
		_ = os.RemoveAll(dir)
	}
}

type StripeEvent struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// Webhook deduplication: the provider's event ID is the run ID, so a
// re-delivered webhook lands on the run the first delivery started.
func Example_webhookDeduplication() {
	handle := jetflow.NewWorkflow("stripe-event", func(ctx *jetflow.Context, ev StripeEvent) (string, error) {
		return jetflow.Step(ctx, "fulfil", func(context.Context) (string, error) {
			return "fulfilled " + ev.ID, nil
		})
	})
	c, stop := exampleEnv(handle)
	defer stop()
	ctx := context.Background()

	ev := StripeEvent{ID: "evt_123", Type: "checkout.session.completed"}
	for delivery := 1; delivery <= 3; delivery++ { // Stripe retries
		h, err := jetflow.Start(ctx, c, handle, ev, jetflow.WithRunID("stripe-"+ev.ID))
		if err != nil {
			panic(err)
		}
		fmt.Println(delivery, h.RunID, h.Outcome, h.Duplicates)
	}
	// Output:
	// 1 stripe-evt_123 created 0
	// 2 stripe-evt_123 existing 1
	// 3 stripe-evt_123 existing 2
}

type Order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// One run per business entity: the order ID is the run ID. The conflict
// policy rejects a second start while the first runs, and starts a new run
// once a failed one is retried by the business.
func Example_oneRunPerEntity() {
	attempts := 0
	fulfil := jetflow.NewWorkflow("fulfil-order", func(ctx *jetflow.Context, o Order) (string, error) {
		return jetflow.Step(ctx, "ship", func(context.Context) (string, error) {
			attempts++
			if attempts == 1 {
				return "", jetflow.Fatal(errors.New("warehouse closed"))
			}
			return "shipped " + o.ID, nil
		})
	}, jetflow.WithDefaultConflictPolicy(jetflow.ConflictPolicy{
		WhileRunning: jetflow.RejectWhileRunning,
		AfterFailed:  jetflow.StartNew,
	}))
	c, stop := exampleEnv(fulfil)
	defer stop()
	ctx := context.Background()

	first, err := jetflow.Start(ctx, c, fulfil, Order{ID: "42", Amount: 1999}, jetflow.WithRunID("order-42"))
	if err != nil {
		panic(err)
	}
	_, err = first.Result(ctx)
	fmt.Println(first.Outcome, errors.Is(err, jetflow.ErrRunFailed))

	again, err := jetflow.Start(ctx, c, fulfil, Order{ID: "42", Amount: 1999}, jetflow.WithRunID("order-42"))
	if err != nil {
		panic(err)
	}
	out, err := again.Result(ctx)
	fmt.Println(again.Outcome, out, err)
	// Output:
	// created true
	// restarted shipped 42 <nil>
}

// Retry-safe triggers: a caller that retries a start it is unsure about (a
// timeout, a crash) gets the same run; a retry that changed the payload is
// refused, as an Idempotency-Key reused with another body is.
func Example_retrySafeTrigger() {
	invoice := jetflow.NewWorkflow("send-invoice", func(ctx *jetflow.Context, o Order) (int, error) {
		return o.Amount, nil
	})
	c, stop := exampleEnv(invoice)
	defer stop()
	ctx := context.Background()

	h, err := jetflow.Start(ctx, c, invoice, Order{ID: "7", Amount: 100}, jetflow.WithRunID("invoice-7"))
	if err != nil {
		panic(err)
	}
	retry, err := jetflow.Start(ctx, c, invoice, Order{ID: "7", Amount: 100}, jetflow.WithRunID("invoice-7"))
	fmt.Println(h.Outcome, retry.Outcome, err)

	_, err = jetflow.Start(ctx, c, invoice, Order{ID: "7", Amount: 999}, jetflow.WithRunID("invoice-7"))
	var conflict *jetflow.ConflictError
	fmt.Println(errors.As(err, &conflict), conflict.Field, conflict.Fields)
	// Output:
	// created existing <nil>
	// true input [{amount changed}]
}

// Passing the step ID to an external API: it is the same on every retry of
// the step and different for every step and run, which is what an
// Idempotency-Key must be.
func Example_stepIDAsIdempotencyKey() {
	var keys []string
	charge := jetflow.NewWorkflow("charge", func(ctx *jetflow.Context, o Order) (string, error) {
		return jetflow.Step(ctx, "charge-card", func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			keys = append(keys, info.StepID) // req.Header.Set("Idempotency-Key", info.StepID)
			if info.Attempt == 1 {
				return "", errors.New("timeout: did the charge go through?")
			}
			return "ch_1", nil
		}, jetflow.WithBackoff(10*time.Millisecond, 10*time.Millisecond))
	})
	c, stop := exampleEnv(charge)
	defer stop()
	ctx := context.Background()
	h, err := jetflow.Start(ctx, c, charge, Order{ID: "9"}, jetflow.WithRunID("order-9"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	fmt.Println(out, err, keys)
	// Output:
	// ch_1 <nil> [order-9.charge-card.0 order-9.charge-card.0]
}

// Choosing keys: a business key when there is one, a composite key when
// the business rule is "once per customer and period", a hash of the
// canonical payload when the payload itself is the identity.
func Example_choosingKeys() {
	business := "order-42"
	composite := fmt.Sprintf("invoice-%s-%s", "cust_7", "2026-11")
	payload, _ := json.Marshal(map[string]any{"to": "ada@example.com", "template": "welcome"})
	sum := sha256.Sum256(payload)
	hashed := "email-" + hex.EncodeToString(sum[:8])
	fmt.Println(business, composite, hashed)
	// Output:
	// order-42 invoice-cust_7-2026-11 email-db7fe99dfa486c13
}

// Task keys: a step whose result is reused across runs for a time, here a
// welcome email sent once per user per day whatever starts it.
func Example_taskKey() {
	sent := 0
	welcome := jetflow.NewWorkflow("welcome", func(ctx *jetflow.Context, user string) (string, error) {
		return jetflow.Step(ctx, "send-email", func(context.Context) (string, error) {
			sent++
			return "msg-" + user, nil
		}, jetflow.WithTaskKey("welcome-"+user, 24*time.Hour), jetflow.WithKeyScope(jetflow.ScopeWorkflow))
	})
	c, stop := exampleEnv(welcome)
	defer stop()
	ctx := context.Background()
	for i := range 3 { // three different runs, one email
		h, err := jetflow.Start(ctx, c, welcome, "ada", jetflow.WithRunID(fmt.Sprintf("signup-%d", i)))
		if err != nil {
			panic(err)
		}
		out, err := h.Result(ctx)
		fmt.Println(out, err)
	}
	fmt.Println("emails sent:", sent)
	// Output:
	// msg-ada <nil>
	// msg-ada <nil>
	// msg-ada <nil>
	// emails sent: 1
}

// Strict input: a start whose input has a field the workflow's input type
// does not declare is refused at admission (ErrInvalidInput), instead of
// running with the field dropped.
func Example_strictInput() {
	signup := jetflow.NewWorkflow("signup", func(ctx *jetflow.Context, o Order) (int, error) {
		return o.Amount, nil
	}, jetflow.WithStrictInput())
	c, stop := exampleEnv(signup)
	defer stop()
	ctx := context.Background()

	_, err := c.StartByName(ctx, "signup", json.RawMessage(`{"id":"8","ammount":100}`), jetflow.WithRunID("signup-8"))
	fmt.Println(errors.Is(err, jetflow.ErrInvalidInput))
	res, err := c.StartByName(ctx, "signup", json.RawMessage(`{"id":"8","amount":100}`), jetflow.WithRunID("signup-8"))
	fmt.Println(res.Outcome, err)
	// Output:
	// true
	// created <nil>
}
