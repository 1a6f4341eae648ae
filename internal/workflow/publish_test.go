package workflow

// What a holder publishes for each kind of await: nothing for a sequential
// step, a task per branch, a timer for a wait. The tap sees every task
// and timer publish on the server; the buckets hold what was committed.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// A run of sequential steps that never waits is one task message, start
// to end: every step runs inline and is committed fenced by the lease, no
// task, timer or lease record is written, and the run task is delivered
// once and acknowledged after the run's end.
func TestSequentialStepsPublishNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		var outs []json.RawMessage
		for _, name := range []string{"a", "b", "c"} {
			out, err := seqStep(c, name, ok(`"`+name+`"`))
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		return json.Marshal(outs)
	}, hk.install)
	s := r.serveCounted(e, 1, true, true)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `["a","b","c"]`, string(end.Output))
	require.Equal(t, "r", await(r, hk.finishes, "Hooks.AfterFinish"))

	for i, name := range []string{"a", "b", "c"} {
		rec := r.step(state.StepID("r", name, 0))
		require.NotNil(t, rec, "step %s not committed", name)
		require.Equal(t, 1, rec.Attempt)
		require.Equal(t, i, rec.Seq)
		require.Equal(t, "w1", rec.Worker)
		require.Nil(t, r.attempts(rec.StepID), "an attempt log for a step that ran once")
	}
	require.Len(t, r.tap.published("jetflow.run."), 1, "a run task besides the start")
	require.Empty(t, r.tap.published("jetflow.branch."), "a sequential step published a branch task")
	require.Empty(t, r.tap.published("jetflow.sched."), "a timer stored")
	l, _ := r.lease("r")
	require.Nil(t, l, "a fast fresh run wrote its lease")
	require.Equal(t, []int{1}, s.runs.of(jetstream.RunSubject(wf, "r")))
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return !ok }, "the run task was not acknowledged")
	for _, id := range []string{"r.a.0", "r.b.0", "r.c.0"} {
		require.Equal(t, commitSeen{id, true}, await(r, hk.commits, "the commit of "+id))
	}
}

// Go followed at once by the Result of that one step is a sequential step
// too: it runs inline.
func TestGoThenGetOfOneStepRunsInline(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.Start("a", RetryPolicy{}, TaskKey{}, ok(`"a"`))
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}, nil)
	r.serveCounted(e, 1, true, false) // no branch consumer: a branch would never run
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.Empty(t, r.tap.published("jetflow.branch."))
}

// fanOut starts x and y beside each other, awaits both, then runs z.
func fanOut(x, y StepFunc) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		px, err := c.Start("x", RetryPolicy{InitialInterval: time.Millisecond}, TaskKey{}, x)
		if err != nil {
			return nil, err
		}
		py, err := c.Start("y", RetryPolicy{InitialInterval: time.Millisecond}, TaskKey{}, y)
		if err != nil {
			return nil, err
		}
		if _, err := c.Await([]*Pending{px, py}, false); err != nil {
			return nil, err
		}
		xo, err := px.Outcome()
		if err != nil {
			return nil, err
		}
		yo, err := py.Outcome()
		if err != nil {
			return nil, err
		}
		z, err := seqStep(c, "z", ok(`"z"`))
		if err != nil {
			return nil, err
		}
		return json.Marshal([]json.RawMessage{xo, yo, z})
	}
}

// Steps started beside each other are branches: the holder publishes a
// task for each, under its step ID, in the order the body started them,
// parks the run on all of them (the lease says parked, epoch 1, the
// waits, all) and acknowledges its task. The branch tasks run on any
// worker, commit with create-if-absent, and the commit that completes
// the await wakes the run, whose next holder goes on.
func TestBranchesPublishTheirTasksAndPark(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	body := fanOut(ok(`"x"`), ok(`"y"`))
	holder := r.executor("holder", body, hk.install)
	r.serveCounted(holder, 1, true, false)
	r.start("r", `{}`)
	require.Equal(t, []string{"r.x.0", "r.y.0"}, await(r, hk.parks, "the park"))

	l, _ := r.lease("r")
	require.NotNil(t, l)
	require.Equal(t, state.LeaseParked, l.State)
	require.Equal(t, 1, l.Epoch)
	require.Equal(t, []string{"r.x.0", "r.y.0"}, l.Waits)
	require.True(t, l.All)
	branches := r.tap.published("jetflow.branch.")
	require.Equal(t, []string{"r.x.0", "r.y.0"}, msgIDs(branches))
	require.Equal(t, jetstream.BranchSubject(wf, "r.x.0"), branches[0].Subject)
	for i, task := range r.tap.tasks(branches) {
		require.Equal(t, []string{"r.x.0", "r.y.0"}[i], task.StepID)
		require.Equal(t, 2, task.Width)
		require.False(t, task.Redispatched, "the first holder to reach the branches marked them redispatched")
		require.False(t, task.Wake)
		_, _, pending := r.pending(jetstream.BranchSubject(wf, task.StepID))
		require.True(t, pending, "branch task %s not stored", task.StepID)
	}
	_, _, pending := r.pending(jetstream.RunSubject(wf, "r"))
	require.False(t, pending, "the parked run's task was not acknowledged")
	require.Nil(t, r.step("r.x.0"), "the holder ran a branch")

	worker := r.executor("brancher", body, nil)
	r.serveCounted(worker, 2, false, true)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `["x","y","z"]`, string(end.Output))
	for _, id := range []string{"r.x.0", "r.y.0"} {
		rec := r.step(id)
		require.Equal(t, "brancher", rec.Worker, "%s was not run by its branch task", id)
		require.Equal(t, 1, rec.Attempt)
	}
	require.Equal(t, "holder", r.step("r.z.0").Worker)
	wakes := r.tap.tasks(r.tap.published("jetflow.run."))[1:]
	require.NotEmpty(t, wakes, "nothing woke the run")
	for _, w := range wakes {
		require.True(t, w.Wake)
		require.Contains(t, []string{"r.x.0", "r.y.0"}, w.StepID)
	}
	require.Len(t, r.tap.published("jetflow.branch."), 2, "a branch task published again")
}

// A holder that did not find the run cleanly (here: a sweep's wake, which
// comes because a branch task or a timer may be lost) publishes the
// branches again, marked redispatched; one still stored absorbs its
// repeat.
func TestAHolderThatFoundTheRunMidwayRedispatches(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	holder := r.executor("holder", fanOut(ok(`"x"`), ok(`"y"`)), hk.install)
	r.serveCounted(holder, 1, true, false)
	run := r.start("r", `{}`)
	await(r, hk.parks, "the first park")
	_, rev := r.runRecord("r")
	r.wake(run, rev, "", "r.sweep.1")
	require.Equal(t, []string{"r.x.0", "r.y.0"}, await(r, hk.parks, "the sweep's park"))

	branches := r.tap.tasks(r.tap.published("jetflow.branch."))
	require.Len(t, branches, 4)
	for _, task := range branches[2:] {
		require.True(t, task.Redispatched, "%s published again unmarked", task.StepID)
	}
	info, err := r.a.Tasks.Info(r.ctx())
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Msgs, "the repeats were not absorbed by the stored branch tasks")
}

// sleeper sleeps for d (counted by the timer clock), then returns when it
// woke.
func sleeper(d time.Duration) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.StartWait("nap", WaitSpec{Kind: state.StepSleep, For: d})
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}
}

// A sleep parks the run with a timer: a wake of the run due at the
// deadline, carried in the task (WakeAt), under the message ID
// <step-id>#wake; nothing else is published. When the timer is due, its
// wake's holder commits the sleep's end (its output: the deadline) and the
// body goes on.
func TestSleepParksWithATimer(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", sleeper(time.Hour), hk.install)
	r.serveCounted(e, 1, true, true)
	began := r.clock.Now()
	r.start("r", `{}`)
	require.Equal(t, []string{"r.nap.0"}, await(r, hk.parks, "the park"))

	timers := r.timers()
	require.Len(t, timers, 1)
	task := timers["r.nap.0"]
	require.True(t, task.Wake)
	require.Equal(t, began.Add(time.Hour).UTC(), task.WakeAt, "the deadline counts from the wait's beginning by the timer clock")
	sched := r.tap.published("jetflow.sched.")
	require.Len(t, sched, 1)
	require.Equal(t, "r.nap.0#wake", sched[0].Header.Get(jetstream.TaskIDHeader))
	require.Len(t, r.tap.published("jetflow.run."), 1)
	require.Empty(t, r.tap.published("jetflow.branch."))
	l, _ := r.lease("r")
	require.Equal(t, state.LeaseParked, l.State)
	require.Equal(t, []string{"r.nap.0"}, l.Waits)
	require.Nil(t, r.step("r.nap.0"))

	r.serveTimers()
	require.Equal(t, 1, r.fireDue(time.Hour))
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	var woke time.Time
	require.NoError(t, json.Unmarshal(end.Output, &woke))
	require.Equal(t, task.WakeAt, woke.UTC())
	rec := r.step("r.nap.0")
	require.Equal(t, state.StepSleep, rec.Kind)
	require.Equal(t, task.WakeAt, rec.WakeAt)
}

// A timer that arrives early by the worker's timer clock ends nothing: its
// task is handed back until the deadline (a nak delayed by what is left),
// and the run is not parked again.
func TestSleepTimerEarlyByTheWorkersClockEndsNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", sleeper(time.Hour), hk.install)
	s := r.serveCounted(e, 1, true, true)
	r.start("r", `{}`)
	await(r, hk.parks, "the park")
	require.Equal(t, jetstream.RunSubject(wf, "r"), await(r, s.runs.handled, "the start task's handling"))
	// The timer's own task, delivered while the timer clock says it is
	// not due yet (the server's clock ahead of the worker's).
	task := r.timers()["r.nap.0"]
	r.publish(jetstream.RunSubject(wf, "r"), "r.nap.0#wake", task)
	require.Equal(t, jetstream.RunSubject(wf, "r"), await(r, s.runs.handled, "the early timer's handling"))
	select {
	case waits := <-hk.parks:
		t.Fatalf("the early timer parked the run again (%v) instead of waiting for its deadline", waits)
	default:
	}
	require.Nil(t, r.step("r.nap.0"), "a sleep ended before its deadline")
	_, _, pending := r.pending(jetstream.RunSubject(wf, "r"))
	require.True(t, pending, "the early timer's task was acknowledged")
	require.Equal(t, []int{1, 1}, []int{s.runs.of(jetstream.RunSubject(wf, "r"))[0], s.runs.of(jetstream.RunSubject(wf, "r"))[1]})
}

// An event wait without a deadline parks with a recheck timer (a wake
// due after WaitRecheck, message ID <step-id>#recheck.<due>); the event,
// committed into the wait's step by its sender, and the sender's wake let
// the body go on with the payload.
func TestEventWaitParksWithARecheck(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: "go"})
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}, hk.install)
	r.serveCounted(e, 1, true, true)
	began := r.clock.Now()
	run := r.start("r", `{}`)
	id := state.StepID("r", state.EventStepName("go"), 0)
	require.Equal(t, []string{id}, await(r, hk.parks, "the park"))
	task := r.timers()[id]
	require.True(t, task.Recheck)
	require.True(t, task.WakeAt.IsZero())
	due := began.Add(WaitRecheck)
	sched := r.tap.published("jetflow.sched.")
	require.NotEmpty(t, sched, "the tap saw no timer publish")
	require.Equal(t, id+"#recheck."+jsonInt(due.Unix()), sched[0].Header.Get(jetstream.TaskIDHeader))

	r.commitStep("r", id, `{"ok":true}`)
	_, rev := r.runRecord("r")
	r.wake(run, rev, id, id+".wake")
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `{"ok":true}`, string(end.Output))
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// An event wait with a timeout parks with a timer at the deadline; when
// it is due and no event came, the holder commits the timeout, a fatal
// failure with code event_timeout, which the body returns: the run fails
// with that code.
func TestEventWaitTimesOut(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: "go", Timeout: time.Minute})
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}, hk.install)
	r.serveCounted(e, 1, true, true)
	r.serveTimers()
	r.start("r", `{}`)
	id := state.StepID("r", state.EventStepName("go"), 0)
	await(r, hk.parks, "the park")
	require.False(t, r.timers()[id].WakeAt.IsZero())
	require.Equal(t, 1, r.fireDue(time.Minute))
	end := r.wait("r")
	require.Equal(t, state.StatusFailed, end.Status)
	require.Equal(t, CodeEventTimeout, end.Error.Code)
	rec := r.step(id)
	require.Equal(t, KindTimeout, rec.Error.Kind)
	require.True(t, rec.Error.Fatal)
}

// An event sent before the body reached its wait is kept in the wait's
// step: the holder that reaches the wait finds it and goes on, without a
// timer.
func TestEventSentEarlyNeedsNoTimer(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	id := state.StepID("r", state.EventStepName("go"), 0)
	r.commitStep("r", id, `"early"`)
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: "go"})
		if err != nil {
			return nil, err
		}
		return c.Result(p)
	}, nil)
	r.serveCounted(e, 1, true, true)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `"early"`, string(end.Output))
	require.Empty(t, r.tap.published("jetflow.sched."))
}

// AwaitFirst of two branches goes on with the one committed first (the
// lowest revision), the same on every replay, and parks on any of them
// (the lease's waits, not all).
func TestAwaitFirstParksOnAnyAndPicksTheFirstCommit(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		px, err := c.Start("x", RetryPolicy{}, TaskKey{}, ok(`"x"`))
		if err != nil {
			return nil, err
		}
		py, err := c.Start("y", RetryPolicy{}, TaskKey{}, ok(`"y"`))
		if err != nil {
			return nil, err
		}
		won, err := c.Await([]*Pending{px, py}, true)
		if err != nil {
			return nil, err
		}
		return []*Pending{px, py}[won].Outcome()
	}
	e := r.executor("w1", body, hk.install)
	r.serveCounted(e, 1, true, false)
	run := r.start("r", `{}`)
	await(r, hk.parks, "the park")
	l, _ := r.lease("r")
	require.False(t, l.All)
	require.Equal(t, []string{"r.x.0", "r.y.0"}, l.Waits)

	// y commits first, then x; the branch tasks are left stored.
	r.commitStep("r", "r.y.0", `"y first"`)
	r.commitStep("r", "r.x.0", `"x second"`)
	_, rev := r.runRecord("r")
	r.wake(run, rev, "r.x.0", "r.x.0.wake")
	end := r.wait("r")
	require.JSONEq(t, `"y first"`, string(end.Output))
}

// A Context cannot await a future another run's replay started.
func TestAwaitOfAForeignFutureIsAnError(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		_, err := c.Await([]*Pending{{id: "other.a.0"}}, false)
		return nil, err
	}, nil)
	r.serveCounted(e, 1, true, false)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusFailed, end.Status)
	require.Contains(t, end.Error.Message, ErrForeignFuture.Error())
}
