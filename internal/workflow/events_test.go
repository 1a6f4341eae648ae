package workflow

// Events and hooks into runs (Sender, deliver.go), and task keys
// (taskkey.go): the commit is the delivery, the run is woken after it,
// and a key's stored result is served instead of running the step.

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// waitsFor is a body that waits for event name twice and returns both
// payloads.
func waitsFor(name string) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		var outs []json.RawMessage
		for range 2 {
			p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: name})
			if err != nil {
				return nil, err
			}
			out, err := c.Result(p)
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return json.Marshal(outs)
	}
}

// waitingForPaid is a rig serving waitsFor("paid"), its run "r" started
// and parked on its first wait, whose step ID it returns with the
// executor's hooks.
func waitingForPaid(t *testing.T) (*rig, *hooked, string) {
	t.Helper()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", waitsFor("paid"), hk.install)
	r.serve(e, 1, false)
	r.start("r", `{}`)
	first := state.StepID("r", state.EventStepName("paid"), 0)
	require.Equal(t, []string{first}, await(r, hk.parks, "the first wait's park"))
	return r, hk, first
}

// An event goes to the first wait for its name without a record, in the
// order the body starts them; a repeat of an event ID with the same
// payload is a duplicate, with another payload a conflict; each delivery
// wakes the parked run, which goes on with the payloads.
func TestSenderCommitsEventsIntoWaitsInOrder(t *testing.T) {
	t.Parallel()
	r, _, first := waitingForPaid(t)

	s := Sender{Assets: r.a, Runs: r.store, Now: time.Now}
	send := func(id, payload string) (Delivery, error) {
		ev := Event{RunID: "r", Name: "paid", ID: id, Payload: json.RawMessage(payload)}
		target, err := s.Resolve(r.ctx(), ev)
		require.NoError(t, err)
		return s.Deliver(r.ctx(), target, ev)
	}
	d, err := send("e1", `{"amount": 1}`)
	require.NoError(t, err)
	require.Equal(t, Delivery{RunID: "r", Workflow: wf, StepID: first}, d)
	d, err = send("e1", `{"amount":1}`)
	require.NoError(t, err)
	require.True(t, d.Duplicate, "a repeat of the same event (canonically the same payload)")
	_, err = send("e1", `{"amount":2}`)
	require.ErrorIs(t, err, ErrEventConflict)

	second := state.StepID("r", state.EventStepName("paid"), 1)
	d, err = send("e2", `{"amount":3}`)
	require.NoError(t, err)
	require.Equal(t, second, d.StepID, "the second event went to a wait that holds one")
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `[{"amount":1},{"amount":3}]`, string(end.Output))
	rec := r.step(first)
	require.Equal(t, "e1", rec.EventID)
	require.Equal(t, state.StepEvent, rec.Kind)

	_, err = send("e3", `{}`)
	require.ErrorIs(t, err, ErrRunEnded)
}

// A hook wait records its token; an event sent to the token resumes that
// wait. A second wait on the same token is refused (hook_taken).
func TestHookTokenResumesItsWait(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.StartWait("", WaitSpec{Kind: state.StepHook, Event: "approval", Token: "tok-approve"})
		if err != nil {
			return nil, err
		}
		out, err := c.Result(p)
		if err != nil {
			return nil, err
		}
		again, err := c.StartWait("", WaitSpec{Kind: state.StepHook, Event: "approval", Token: "tok-approve"})
		if err != nil {
			return nil, err
		}
		if _, err := c.Result(again); err != nil {
			return json.Marshal(map[string]any{"out": out, "again": err.Error()})
		}
		return nil, nil
	}, hk.install)
	r.serve(e, 1, false)
	r.start("r", `{}`)
	id := state.StepID("r", state.HookStepName("approval"), 0)
	require.Equal(t, []string{id}, await(r, hk.parks, "the hook wait's park"))
	h, err := HookTokens{Assets: r.a}.Get(r.ctx(), "tok-approve")
	require.NoError(t, err)
	require.Equal(t, id, h.StepID)
	require.Equal(t, "r", h.RunID)

	s := Sender{Assets: r.a, Runs: r.store, Now: time.Now}
	ev := Event{Token: "tok-approve", ID: "a1", Payload: json.RawMessage(`"yes"`)}
	target, err := s.Resolve(r.ctx(), ev)
	require.NoError(t, err)
	require.Equal(t, id, target.StepID)
	_, err = s.Deliver(r.ctx(), target, ev)
	require.NoError(t, err)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	var out struct {
		Out   string `json:"out"`
		Again string `json:"again"`
	}
	require.NoError(t, json.Unmarshal(end.Output, &out))
	require.Equal(t, "yes", out.Out)
	require.Contains(t, out.Again, "tok-approve")
	rec := r.step(state.StepID("r", state.HookStepName("approval"), 1))
	require.Equal(t, CodeHookTaken, rec.Error.Code)
}

// A step called with a task key runs once per key: a later call with the
// same key (here the step's next occurrence in the same run) is served
// the stored result, without running, and its record says where the
// result came from.
func TestTaskKeyServesAStoredResult(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var calls atomic.Int32
	key := TaskKey{Key: "order-1", Set: true, TTL: time.Hour, Scope: state.ScopeRun}
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		send := func(context.Context) (json.RawMessage, error) {
			return json.Marshal(calls.Add(1))
		}
		a, err := c.StepWithKey("send", RetryPolicy{}, key, send)
		if err != nil {
			return nil, err
		}
		b, err := c.StepWithKey("send", RetryPolicy{}, key, send)
		if err != nil {
			return nil, err
		}
		return json.Marshal([]json.RawMessage{a, b})
	}, nil)
	r.serve(e, 1, false)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `[1,1]`, string(end.Output))
	require.Equal(t, int32(1), calls.Load(), "a keyed step ran twice")
	v, _, err := r.a.Steps.Get(r.ctx(), "r.send.1")
	require.NoError(t, err)
	served, err := state.DecodeKeyedStep(v)
	require.NoError(t, err)
	require.NotNil(t, served.TaskKey)
	require.True(t, served.TaskKey.Served)
	require.Equal(t, "r.send.0", served.TaskKey.From)
	v, _, err = r.a.Steps.Get(r.ctx(), "r.send.0")
	require.NoError(t, err)
	ran, err := state.DecodeKeyedStep(v)
	require.NoError(t, err)
	require.NotNil(t, ran.TaskKey)
	require.False(t, ran.TaskKey.Served)
}
