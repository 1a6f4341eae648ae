package jetflow

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waiterFlow waits for each kind of thing in turn: a step, an event with a
// timeout, a step, a hook without one, a child run, then a 24 h sleep.
func waiterFlow(kid *Workflow[int, int]) *Workflow[string, string] {
	return NewWorkflow("waiter", func(ctx *Context, id string) (string, error) {
		if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
			return "", err
		}
		if _, err := WaitEvent[carrierUpdate](ctx, "carrier", WithTimeout(time.Hour)); err != nil {
			return "", err
		}
		if _, err := Step(ctx, "notify", func(context.Context) (int, error) { return 2, nil }); err != nil {
			return "", err
		}
		if _, err := WaitEvent[carrierUpdate](ctx, "approval", WithHookToken("approve-"+id)); err != nil {
			return "", err
		}
		if _, err := Child(ctx, kid, 1, WithChildRunID("kid-"+id)).Get(ctx); err != nil {
			return "", err
		}
		return "slept", Sleep(ctx, "cool-off", 24*time.Hour)
	}, WithEvent[carrierUpdate]("carrier"), WithEvent[carrierUpdate]("approval"))
}

// kidFlow waits for an event "go" before it ends.
func kidFlow() *Workflow[int, int] {
	return NewWorkflow("waiter-kid", func(ctx *Context, n int) (int, error) {
		if _, err := WaitEvent[carrierUpdate](ctx, "go"); err != nil {
			return 0, err
		}
		return n, nil
	}, WithEvent[carrierUpdate]("go"))
}

// A run says what it waits for, since when and until when, for each kind
// of wait; an event that ends a wait is listed where the wait stands in
// call order, not before the steps that ran before it; a committed wait
// has the time it began.
func TestOpenWaitsInCallOrder(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	kid := kidFlow()
	wf := waiterFlow(kid)
	env.worker(WorkerConfig{Concurrency: 4}, wf, kid)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	began := time.Now()
	_, err := Start(ctx, c, wf, "w1", WithRunID("w-1"))
	require.NoError(t, err)

	carrier := waitFor(t, ctx, c, "w-1", "event")
	require.Equal(t, "w-1.event=carrier.0", carrier.StepID)
	require.Equal(t, "event=carrier", carrier.Name)
	require.Equal(t, "carrier", carrier.Event)
	require.Equal(t, time.Hour, carrier.Until.Sub(carrier.Since), "the deadline is the timeout counted from the wait's start")
	require.False(t, carrier.Since.Before(began.Add(-time.Second)), "since %s, started %s", carrier.Since, began)
	requireNames(t, c, "w-1", "charge")

	_, err = c.SendEvent(ctx, "w-1", "carrier", "evt-1", json.RawMessage(`{"status":"delivered"}`))
	require.NoError(t, err)

	hook := waitFor(t, ctx, c, "w-1", "hook")
	require.Equal(t, "approve-w1", hook.HookToken)
	require.Equal(t, "approval", hook.Event)
	require.True(t, hook.Until.IsZero(), "a wait without a timeout has no deadline: %s", hook.Until)
	steps := requireNames(t, c, "w-1", "charge", "event=carrier", "notify")
	require.Equal(t, carrier.Since, steps[1].StartedAt, "the event's record begins when its wait began")
	require.False(t, steps[1].CommittedAt.Before(steps[1].StartedAt))

	_, err = c.Resume(ctx, "approve-w1", "ok-1", json.RawMessage(`{"status":"approved"}`))
	require.NoError(t, err)

	child := waitFor(t, ctx, c, "w-1", "child")
	require.Equal(t, "kid-w1", child.ChildRunID)
	kidWait := waitFor(t, ctx, c, "kid-w1", "event")
	require.Equal(t, "go", kidWait.Event)
	_, err = c.SendEvent(ctx, "kid-w1", "go", "go-1", json.RawMessage(`{"status":"go"}`))
	require.NoError(t, err)

	nap := waitFor(t, ctx, c, "w-1", "sleep")
	require.Equal(t, "cool-off", nap.Name)
	require.Equal(t, 24*time.Hour, nap.Until.Sub(nap.Since))
	requireNames(t, c, "w-1", "charge", "event=carrier", "notify", "hook=approval", "waiter-kid")

	// An event sent before the body reaches its wait is listed last until
	// then, and in the wait's place after.
	release := make(chan struct{})
	early := NewWorkflow("early", func(ctx *Context, _ int) (string, error) {
		if _, err := Step(ctx, "first", func(context.Context) (int, error) { <-release; return 1, nil }); err != nil {
			return "", err
		}
		if _, err := WaitEvent[carrierUpdate](ctx, "carrier"); err != nil {
			return "", err
		}
		return Step(ctx, "after", func(context.Context) (string, error) { return "done", nil })
	}, WithEvent[carrierUpdate]("carrier"))
	env.worker(WorkerConfig{}, early)
	eh, err := Start(ctx, c, early, 0, WithRunID("e-1"))
	require.NoError(t, err)
	_, err = c.SendEvent(ctx, "e-1", "carrier", "evt-e", json.RawMessage(`{"status":"early"}`))
	require.NoError(t, err)
	requireNames(t, c, "e-1", "event=carrier")
	close(release)
	_, err = eh.Result(ctx)
	require.NoError(t, err)
	requireNames(t, c, "e-1", "first", "event=carrier", "after")
	ws, err := c.OpenWaits(ctx, "e-1")
	require.NoError(t, err)
	require.Empty(t, ws)
}

// waitFor waits until runID's only open wait is of kind and returns it.
func waitFor(t *testing.T, ctx context.Context, c *Client, runID, kind string) OpenWait {
	t.Helper()
	var last []OpenWait
	for ctx.Err() == nil {
		ws, err := c.OpenWaits(ctx, runID)
		require.NoError(t, err)
		if len(ws) == 1 && ws[0].Kind == kind {
			return ws[0]
		}
		last = ws
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("run %s: no open %s wait; open waits: %+v", runID, kind, last)
	return OpenWait{}
}

// requireNames checks runID's committed steps are names, in that order,
// and returns them.
func requireNames(t *testing.T, c *Client, runID string, names ...string) []StepRecord {
	t.Helper()
	steps, err := c.Steps(ctxT(t, 10*time.Second), runID)
	require.NoError(t, err)
	got := make([]string, len(steps))
	for i, s := range steps {
		got[i] = s.Name
	}
	require.Equal(t, names, got)
	return steps
}

// An event sent while the run is parked at an earlier wait is placed where
// its own wait stands, after the sleep; the loser of an AwaitFirst is not
// an open wait once the run has moved on; an ended run waits for nothing.
func TestOpenWaitsAfterParkRaceAndEnd(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	parked := NewWorkflow("parked", func(ctx *Context, _ int) (string, error) {
		if err := Sleep(ctx, "nap", time.Second); err != nil {
			return "", err
		}
		if _, err := WaitEvent[carrierUpdate](ctx, "carrier"); err != nil {
			return "", err
		}
		return Step(ctx, "after", func(context.Context) (string, error) { return "done", nil })
	}, WithEvent[carrierUpdate]("carrier"))
	racer := NewWorkflow("racer", func(ctx *Context, _ int) (string, error) {
		ev := OnEvent[carrierUpdate](ctx, "carrier")
		if _, err := AwaitFirst(ctx, ev, Timer(ctx, "give-up", time.Hour)); err != nil {
			return "", err
		}
		_, err := WaitEvent[carrierUpdate](ctx, "next")
		return "next", err
	}, WithEvent[carrierUpdate]("carrier"), WithEvent[carrierUpdate]("next"))
	env.worker(WorkerConfig{Concurrency: 4}, parked, racer)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	h, err := Start(ctx, c, parked, 0, WithRunID("pk-1"))
	require.NoError(t, err)
	waitFor(t, ctx, c, "pk-1", "sleep")
	_, err = c.SendEvent(ctx, "pk-1", "carrier", "evt-pk", json.RawMessage(`{"status":"early"}`))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	steps := requireNames(t, c, "pk-1", "nap", "event=carrier", "after")
	require.False(t, steps[1].StartedAt.After(steps[1].CommittedAt), "a wait begins no later than it ends")

	_, err = Start(ctx, c, racer, 0, WithRunID("rc-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ws, err := c.OpenWaits(ctx, "rc-1")
		require.NoError(t, err)
		return len(ws) == 2
	}, 20*time.Second, 20*time.Millisecond, "the race's two waits")
	_, err = c.SendEvent(ctx, "rc-1", "carrier", "evt-rc", json.RawMessage(`{"status":"won"}`))
	require.NoError(t, err)
	next := waitFor(t, ctx, c, "rc-1", "event")
	require.Equal(t, "next", next.Event, "the timer that lost the race is not waited for")

	_, err = c.CancelRun(ctx, "rc-1")
	require.NoError(t, err)
	ws, err := c.OpenWaits(ctx, "rc-1")
	require.NoError(t, err)
	require.Empty(t, ws, "a cancelled run waits for nothing")
	d, err := c.Describe(ctx, "rc-1")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, d.Status)
	require.Empty(t, d.Waits)
}
