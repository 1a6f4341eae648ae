package workflow

// A cancelled run: nothing is started after the cancel, nothing a holder
// or a branch finishes after it is committed, and its tasks are dropped.

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// twoSteps is a body of sequential steps a (fn) and b.
func twoSteps(a StepFunc, b *atomic.Int32) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		if _, err := seqStep(c, "a", a); err != nil {
			return nil, err
		}
		return seqStep(c, "b", func(context.Context) (json.RawMessage, error) {
			b.Add(1)
			return json.RawMessage(`"b"`), nil
		})
	}
}

// A cancel that lands while a sequential step runs (its worker missed the
// notice): the step runs to its end, its commit is refused by the moved
// lease, the next step is never started, and the task is dropped.
func TestCancelDuringAStepStartsNothingAfter(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	started, release := make(chan struct{}), make(chan struct{})
	var b atomic.Int32
	e := r.executor("w1", twoSteps(func(context.Context) (json.RawMessage, error) {
		close(started)
		<-release
		return json.RawMessage(`"a"`), nil
	}, &b), hk.install)
	r.serveCounted(e, 1, true, false)
	r.start("r", `{}`)
	await(r, started, "step a's start")
	run, cancelled, err := r.store.Cancel(r.ctx(), "r")
	require.NoError(t, err)
	require.True(t, cancelled)
	close(release)

	require.Equal(t, commitSeen{"r.a.0", false}, await(r, hk.commits, "step a's refused commit"))
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return !ok }, "the cancelled run's task was not dropped")
	require.Nil(t, r.step("r.a.0"), "a step committed after the cancel")
	require.Nil(t, r.step("r.b.0"))
	require.Zero(t, b.Load(), "a step started after the cancel")
	require.Equal(t, []int{1}, hk.attempts.of("r.a.0"))
	require.Empty(t, hk.attempts.of("r.b.0"))
	end, _ := r.runRecord("r")
	require.Equal(t, state.StatusCancelled, end.Status)
	require.Equal(t, run.UpdatedAt, end.UpdatedAt, "the holder wrote the cancelled run's record")
	l, _ := r.lease("r")
	require.Equal(t, state.LeaseCancelled, l.State)
}

// The cancel notice (MarkCancelled, with the run's token) cancels the
// context of the run's running step with cause ErrRunCancelled; a notice
// with another token (another run under the same ID) does not. The step's
// attempt commits nothing and the task is dropped.
func TestCancelNoticeCancelsTheRunningStep(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	started := make(chan struct{})
	causes := make(chan error, 1)
	ask := make(chan chan error) // asks the running step whether its context is done
	var b atomic.Int32
	e := r.executor("w1", twoSteps(func(ctx context.Context) (json.RawMessage, error) {
		close(started)
		for {
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
				return nil, ctx.Err()
			case reply := <-ask:
				reply <- ctx.Err()
			}
		}
	}, &b), hk.install)
	r.serveCounted(e, 1, true, false)
	run := r.start("r", `{}`)
	await(r, started, "step a's start")
	e.MarkCancelled("r", "another run's token")
	reply := make(chan error)
	ask <- reply
	require.NoError(t, await(r, reply, "the step's answer"), "a notice for another token cancelled the step")
	_, _, err := r.store.Cancel(r.ctx(), "r")
	require.NoError(t, err)
	e.MarkCancelled("r", run.Token)
	require.ErrorIs(t, await(r, causes, "the step's cancellation"), ErrRunCancelled)
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return !ok }, "the cancelled run's task was not dropped")
	require.Nil(t, r.step("r.a.0"))
	require.Zero(t, b.Load())
	require.Nil(t, r.attempts("r.a.0"), "a cancelled attempt was logged as a failure to retry")
}

// Branch tasks of a run cancelled after they were published start
// nothing: each reads the run's record and lease first, and is dropped.
func TestBranchesOfACancelledRunStartNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	var calls atomic.Int32
	count := func(context.Context) (json.RawMessage, error) { calls.Add(1); return json.RawMessage(`1`), nil }
	e := r.executor("w1", fanOut(count, count), hk.install)
	r.serveCounted(e, 1, true, false)
	r.start("r", `{}`)
	await(r, hk.parks, "the park")
	_, _, err := r.store.Cancel(r.ctx(), "r")
	require.NoError(t, err)

	s := r.serveCounted(e, 2, false, true)
	for _, id := range []string{"r.x.0", "r.y.0"} {
		r.eventually(func() bool { return len(s.branches.of(jetstream.BranchSubject(wf, id))) == 1 }, "%s's task not delivered", id)
		r.eventually(func() bool { _, _, ok := r.pending(jetstream.BranchSubject(wf, id)); return !ok }, "%s's task not dropped", id)
		require.Nil(t, r.step(id), "a branch of a cancelled run committed")
	}
	require.Zero(t, calls.Load(), "a branch of a cancelled run ran")
	require.Empty(t, hk.attempts.of("r.x.0"))
	require.Len(t, r.tap.published("jetflow.run."), 1, "a branch of a cancelled run woke it")
}

// A branch that finishes after its run was cancelled commits its result
// (create-if-absent is not fenced), which changes nothing: the run stays
// cancelled, the body does not go on, and the run is not woken (its lease
// is not parked).
func TestBranchFinishingAfterTheCancelChangesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	started, release := make(chan struct{}), make(chan struct{})
	slow := func(context.Context) (json.RawMessage, error) {
		close(started)
		<-release
		return json.RawMessage(`"x"`), nil
	}
	e := r.executor("w1", fanOut(slow, ok(`"y"`)), hk.install)
	s := r.serveCounted(e, 2, true, true)
	r.start("r", `{}`)
	await(r, started, "branch x's start")
	_, _, err := r.store.Cancel(r.ctx(), "r")
	require.NoError(t, err)
	close(release)
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.BranchSubject(wf, "r.x.0")); return !ok }, "x's task not settled")
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return !ok }, "a run task of the cancelled run is left")
	end, _ := r.runRecord("r")
	require.Equal(t, state.StatusCancelled, end.Status)
	require.Nil(t, r.step("r.z.0"), "the body went on after the cancel")
	require.Equal(t, 1, len(s.branches.of(jetstream.BranchSubject(wf, "r.x.0"))))
	require.NotNil(t, r.step("r.x.0"), "the running branch's result")
	require.Len(t, r.tap.published("jetflow.run."), 1, "the cancelled run was woken")
}
