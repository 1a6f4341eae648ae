package jetflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jetflow/jetflow"
)

// A durable sleep: the run sleeps between two steps, holding no worker,
// goroutine or timer while it does. The wake-up is a message the NATS
// server stores, so it survives a restart of the worker and of the
// server, and it never comes before the sleep's time has passed. The
// sleep is a step of the run (kind "sleep"), so a replay after the
// wake-up goes past it at once.
func ExampleSleep() {
	signup := jetflow.NewWorkflow("signup", func(ctx *jetflow.Context, user string) (string, error) {
		if _, err := jetflow.Step(ctx, "welcome", func(context.Context) (string, error) {
			return "welcome email to " + user, nil
		}); err != nil {
			return "", err
		}
		if err := jetflow.Sleep(ctx, "cool-off", time.Second); err != nil { // days, in a real signup
			return "", err
		}
		return jetflow.Step(ctx, "tips", func(context.Context) (string, error) {
			return "tips email to " + user, nil
		})
	})
	c, stop := exampleEnv(signup)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	started := time.Now()
	h, err := jetflow.Start(ctx, c, signup, "ada", jetflow.WithRunID("signup-ada"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(out, "- slept at least 1s:", time.Since(started) >= time.Second)
	steps, err := c.Steps(ctx, "signup-ada")
	if err != nil {
		panic(err)
	}
	printSteps(steps)
	// Output:
	// tips email to ada - slept at least 1s: true
	// signup-ada.welcome.0
	// signup-ada.cool-off.0 sleep
	// signup-ada.tips.0
}

// printSteps prints each step's ID, and its kind for a sleep or a wait.
func printSteps(steps []jetflow.StepRecord) {
	for _, s := range steps {
		fmt.Println(strings.TrimSpace(s.StepID + " " + s.Kind))
	}
}

type Payment struct {
	AmountCents int64  `json:"amount_cents"`
	Reference   string `json:"reference"`
}

// An event into a run: the run waits for "payment-confirmed", which the
// workflow declares with its payload type (WithEvent), and a client sends
// it to the run by run ID and name with an event ID of its own (the
// payment provider's). An event sent before the body reaches its wait is
// kept until it does. Sending the same event ID again (a retry, a
// redelivered webhook) is a duplicate and changes nothing.
func ExampleWaitEvent() {
	shown := make(chan struct{}) // the example has shown the duplicate
	invoice := jetflow.NewWorkflow("invoice", func(ctx *jetflow.Context, id string) (string, error) {
		p, err := jetflow.WaitEvent[Payment](ctx, "payment-confirmed")
		if err != nil {
			return "", err
		}
		return jetflow.Step(ctx, "mark-paid", func(sctx context.Context) (string, error) {
			select { // keeps the run going until the duplicate is shown
			case <-shown:
			case <-sctx.Done():
				return "", sctx.Err()
			}
			return fmt.Sprintf("%s paid %d cents (%s)", id, p.AmountCents, p.Reference), nil
		})
	}, jetflow.WithEvent[Payment]("payment-confirmed"))
	c, stop := exampleEnv(invoice)
	defer stop()
	defer close(shown) // before stop: Stop waits for the running step
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	h, err := jetflow.Start(ctx, c, invoice, "inv-7", jetflow.WithRunID("invoice-inv-7"))
	if err != nil {
		panic(err)
	}
	payload := json.RawMessage(`{"amount_cents":1999,"reference":"pi_123"}`)
	for range 2 {
		res, err := c.SendEvent(ctx, "invoice-inv-7", "payment-confirmed", "evt_pi_123", payload)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Outcome, res.StepID)
	}
	shown <- struct{}{}
	out, err := h.Result(ctx)
	fmt.Println(out, err)
	// Output:
	// delivered invoice-inv-7.event=payment-confirmed.0
	// duplicate invoice-inv-7.event=payment-confirmed.0
	// inv-7 paid 1999 cents (pi_123) <nil>
}

type Approval struct {
	By       string `json:"by"`
	Approved bool   `json:"approved"`
}

// A hook: the run waits on a token it derives from its input, and an
// outside system resumes it by that token, without knowing the run ID.
// The token is resumable once the run reaches its wait; before that,
// Resume is ErrHookNotFound and stores nothing. A token resumes one wait
// once: after the run has used it, another event is refused.
func ExampleWithHookToken() {
	refund := jetflow.NewWorkflow("refund", func(ctx *jetflow.Context, order string) (string, error) {
		a, err := jetflow.WaitEvent[Approval](ctx, "approval", jetflow.WithHookToken(order+"-refund-approval"))
		if err != nil {
			return "", err
		}
		if !a.Approved {
			return "refund of " + order + " refused by " + a.By, nil
		}
		return jetflow.Step(ctx, "refund", func(context.Context) (string, error) {
			return "refunded " + order + ", approved by " + a.By, nil
		})
	}, jetflow.WithEvent[Approval]("approval"))
	c, stop := exampleEnv(refund)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	approve := json.RawMessage(`{"by":"grace","approved":true}`)
	_, err := c.Resume(ctx, "o-42-refund-approval", "ticket-1", approve)
	fmt.Println("before the run:", errors.Is(err, jetflow.ErrHookNotFound))

	h, err := jetflow.Start(ctx, c, refund, "o-42", jetflow.WithRunID("refund-o-42"))
	if err != nil {
		panic(err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for { // until the run has reached its wait
		res, err := c.Resume(ctx, "o-42-refund-approval", "ticket-1", approve)
		if err == nil {
			fmt.Println(res.Outcome, res.RunID, res.StepID)
			break
		}
		if !errors.Is(err, jetflow.ErrHookNotFound) {
			panic(err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			panic(ctx.Err())
		}
	}
	out, err := h.Result(ctx)
	fmt.Println(out, err)
	_, err = c.Resume(ctx, "o-42-refund-approval", "ticket-2", approve)
	fmt.Println("after the run:", errors.Is(err, jetflow.ErrEventConflict))
	// Output:
	// before the run: true
	// delivered refund-o-42 refund-o-42.hook=approval.0
	// refunded o-42, approved by grace <nil>
	// after the run: true
}

type Delivery struct {
	Carrier string `json:"carrier"`
}

// Racing an event against a timer: the order waits for the carrier's
// "carrier-delivered" event and sends a reminder each time a timer wins,
// twice, then gives up. The event wait is started once, before the loop,
// and raced against a new timer in each turn: a wait the body no longer
// awaits still takes the next event, so a wait started in each turn would
// leave the event in an abandoned one. Here no event comes, and the timers
// win.
func ExampleOnEvent() {
	reminders := jetflow.NewWorkflow("delivery", func(ctx *jetflow.Context, order string) (string, error) {
		delivered := jetflow.OnEvent[Delivery](ctx, "carrier-delivered")
		for i := range 2 {
			timer := jetflow.Timer(ctx, "reminder-due", 500*time.Millisecond) // days, in a real shop
			won, err := jetflow.AwaitFirst(ctx, delivered, timer)
			if err != nil {
				return "", err
			}
			if won == 0 {
				d, err := delivered.Get(ctx)
				return order + " delivered by " + d.Carrier, err
			}
			if _, err := jetflow.Step(ctx, "send-reminder", func(context.Context) (string, error) {
				return fmt.Sprintf("reminder %d for %s", i+1, order), nil
			}); err != nil {
				return "", err
			}
		}
		return order + ": no delivery news after 2 reminders", nil
	}, jetflow.WithEvent[Delivery]("carrier-delivered"))
	c, stop := exampleEnv(reminders)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	h, err := jetflow.Start(ctx, c, reminders, "o-7", jetflow.WithRunID("delivery-o-7"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	steps, err := c.Steps(ctx, "delivery-o-7")
	if err != nil {
		panic(err)
	}
	printSteps(steps)
	// Output:
	// o-7: no delivery news after 2 reminders
	// delivery-o-7.reminder-due.0 sleep
	// delivery-o-7.send-reminder.0
	// delivery-o-7.reminder-due.1 sleep
	// delivery-o-7.send-reminder.1
}
