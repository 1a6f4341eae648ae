package workflow

// Child runs: the holder that reaches a child step links the child on the
// parent's record, admits the child run, stores a recheck timer and
// parks; the child's end commits the parent's step and wakes it.

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// parentOrChild is a body of wf that, run with input "child", is the
// child (it runs step c with fn); run with any other input it starts a
// child of workflow child (wf when empty) and returns its result.
func parentOrChild(child string, fn StepFunc) func(c *Context, in json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, in json.RawMessage) (json.RawMessage, error) {
		if string(in) == `"child"` {
			return seqStep(c, "c", fn)
		}
		workflow := child
		if workflow == "" {
			workflow = wf
		}
		p, err := c.StartChild("kid", ChildSpec{Workflow: workflow, Input: json.RawMessage(`"child"`)})
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}
}

// childHooks records the child hooks' calls.
type childHooks struct {
	mu              sync.Mutex
	admits, started []string // "<step>/<child run>"
}

func (h *childHooks) install(c *Config) {
	c.Hooks.BeforeChildAdmit = func(step, child string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.admits = append(h.admits, step+"/"+child)
	}
	c.Hooks.AfterChildStart = func(step, child string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.started = append(h.started, step+"/"+child)
	}
}

// A child step, first: the parent's holder links the child on the
// parent's record, admits it (its record names its parent and step, its
// start task is published), stores the step's recheck timer and parks on
// the step. The child's end commits the parent's step with the child's
// output and wakes the parent, which goes on.
func TestChildRunStartsParksAndResumesItsParent(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	var ch childHooks
	e := r.executor("w1", parentOrChild("", ok(`"from the child"`)), func(c *Config) {
		hk.install(c)
		ch.install(c)
	})
	// The parent's holder alone first: the child's tasks wait.
	r.serveHandlers(1, false, probeFirst(e), nil)
	r.start("r", `{}`)
	require.Equal(t, []string{"r.kid.0"}, await(r, hk.parks, "the parent's park"))

	childID := state.ChildRunID("r", 0, "kid", 0)
	parent, _ := r.runRecord("r")
	require.Len(t, parent.Children, 1)
	require.Equal(t, childID, parent.Children[0].RunID)
	require.Equal(t, "r.kid.0", parent.Children[0].StepID)
	child, _ := r.runRecord(childID)
	require.NotNil(t, child.Parent)
	require.Equal(t, "r", child.Parent.RunID)
	require.Equal(t, "r.kid.0", child.Parent.StepID)
	require.Equal(t, parent.Token, child.Parent.Token)
	require.Equal(t, state.StatusRunning, child.Status)
	_, _, pending := r.pending(jetstream.RunSubject(wf, childID))
	require.True(t, pending, "the child's start task was not published")
	timer := r.timers()["r.kid.0"]
	require.True(t, timer.Recheck, "a running child holds its parent's recheck timer")
	ch.mu.Lock()
	require.Equal(t, []string{"r.kid.0/" + childID}, ch.admits)
	require.Equal(t, []string{"r.kid.0/" + childID}, ch.started)
	ch.mu.Unlock()

	r.serve(e, 2, false)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `"from the child"`, string(end.Output))
	rec := r.step("r.kid.0")
	require.Equal(t, childID, rec.Child)
	child, _ = r.runRecord(childID)
	require.Equal(t, state.StatusCompleted, child.Status)
}

// probeFirst is e's run handler for the first run task it gets (the
// parent's start); later run tasks are left for another consumer of the
// test's (naked at once).
func probeFirst(e *Executor) probe {
	var once sync.Once
	return func(ctx context.Context, m *consume.Delivery) {
		ran := false
		once.Do(func() { ran = true; e.Runs().Handle(ctx, m) })
		if !ran {
			_ = m.Msg.Nak()
		}
	}
}

// How a child step ends when its child does not complete: a failed child
// fails the step (kind child, the child's code), a child that cannot be
// started (a workflow no worker serves) is refused; either way the step's
// failure is fatal and the parent, returning it, fails.
func TestChildThatDoesNotComplete(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		body  func(c *Context, in json.RawMessage) (json.RawMessage, error)
		kind  string
		code  string
		child bool // the child run exists
	}{
		{"the child fails", parentOrChild("", func(context.Context) (json.RawMessage, error) { return nil, fatal{"child_broke"} }),
			KindChildFailed, "child_broke", true},
		{"the child's workflow is served by nobody", parentOrChild("nobody", ok(`1`)), KindChildRefused, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			e := r.executor("w1", tc.body, nil)
			r.serve(e, 2, false)
			r.start("r", `{}`)
			end := r.wait("r")
			require.Equal(t, state.StatusFailed, end.Status)
			require.Equal(t, tc.code, end.Error.Code)
			rec := r.step("r.kid.0")
			require.NotNil(t, rec)
			require.Equal(t, tc.kind, rec.Error.Kind)
			require.True(t, rec.Error.Fatal)
			childID := state.ChildRunID("r", 0, "kid", 0)
			require.Equal(t, childID, rec.Child)
			_, _, err := r.store.Get(r.ctx(), childID)
			require.Equal(t, tc.child, err == nil, "child record: %v", err)
		})
	}
}
