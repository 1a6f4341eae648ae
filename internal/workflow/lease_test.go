package workflow

// Ownership of a run: which delivery of a run task holds the run's lease,
// how it holds it (Executor.hold, loadRun), and what the lease lets it
// write (lease.go). Each case drives real deliveries of a real consumer
// into the executor's own functions and asserts the decision, the lease
// record in jetflow_steps and what happened to the task message.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// holdOutcome is what a delivery's attempt to take its run's lease found.
type holdOutcome struct {
	d         *delivery
	h         held
	s         *settlement
	took      time.Duration
	seq       uint64
	delivered int
}

// verdict names an outcome for the decision table.
func (o holdOutcome) verdict() string {
	if o.s != nil {
		return settleName(o.s.kind)
	}
	switch {
	case o.h.fresh:
		return "fresh"
	case o.h.clean:
		return "clean"
	case o.h.lease.written:
		return "taken over"
	case o.h.inherited:
		return "inherited"
	}
	return "held"
}

func settleName(k settleKind) string {
	switch k {
	case settleFinish:
		return "finish"
	case settlePark:
		return "park"
	case settleRetry:
		return "retry"
	case settleRelease:
		return "release"
	case settleDrop:
		return "drop"
	case settleLost:
		return "lost"
	case settleDone:
		return "done"
	case settleStray:
		return "stray"
	}
	return fmt.Sprintf("settlement %d", k)
}

// tryHold is what handleRun does before it replays: decode the delivery,
// load its run, take the lease.
func (e *Executor) tryHold(ctx context.Context, m *consume.Delivery) (o holdOutcome, untrack func()) {
	begun := time.Now()
	d := e.newDelivery(ctx, m)
	o.d = d
	if d == nil {
		return o, func() {}
	}
	if s := e.loadRun(d); s != nil {
		o.s = s
		return o, func() {}
	}
	untrack = e.inflight.track(d, ctx)
	o.h, o.s = e.hold(d)
	o.took = time.Since(begun)
	return o, untrack
}

// holdProbe serves wf's run tasks with e's hold: deliveries before the
// judged one (judge false) are handed back at once; the judged one takes
// the lease, reports, then runs then (nil: terminate the task, leaving
// the lease as the delivery left it) before it returns. Deliveries after
// the judged one are terminated.
func (r *rig) holdProbe(e *Executor, judge func(delivered int) bool, then func(o holdOutcome)) <-chan holdOutcome {
	out := make(chan holdOutcome, 1)
	var judged atomic.Bool
	r.serveHandlers(2, false, probe(func(ctx context.Context, m *consume.Delivery) {
		seq, delivered := meta(r.t, m)
		switch {
		case judged.Load():
			_ = m.Msg.Term()
			return
		case !judge(delivered):
			_ = m.Msg.Nak()
			return
		}
		judged.Store(true)
		o, untrack := e.tryHold(ctx, m)
		defer untrack()
		o.seq, o.delivered = seq, delivered
		out <- o
		if then != nil {
			then(o)
			return
		}
		_ = m.Msg.Term()
	}), nil)
	return out
}

// createRun writes the record of a running run runID of wf (no start task).
func (r *rig) createRun(runID string, tweak func(*state.Run)) (state.Run, uint64) {
	r.t.Helper()
	now := time.Now().UTC()
	run := state.Run{V: state.Version, RunID: runID, Workflow: wf, Input: json.RawMessage(`{}`), Status: state.StatusRunning,
		Token: "tok-" + runID, CreatedAt: now, UpdatedAt: now, Exec: state.ExecLease}
	if tweak != nil {
		tweak(&run)
	}
	rev, err := r.store.Create(r.ctx(), run)
	require.NoError(r.t, err)
	return run, rev
}

// startTaskFinding is a setup of TestHoldDecisions: the running run "r",
// its lease record l (nil: none), and a start task of it with token (""
// the run's own), whose first delivery is judged.
func startTaskFinding(l *state.Lease, token string) func(r *rig) func(int) bool {
	return func(r *rig) func(int) bool {
		run, _ := r.createRun("r", nil)
		if l != nil {
			r.putLease("r", *l)
		}
		if token == "" {
			token = run.Token
		}
		r.publish(jetstream.RunSubject(wf, "r"), "r", state.Task{RunID: "r", Workflow: wf, Input: run.Input, Token: token})
		return first
	}
}

func noBody(*Context, json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`null`), nil }

func first(delivered int) bool  { return delivered == 1 }
func second(delivered int) bool { return delivered == 2 }

// The decision table of hold and loadRun: for each state of the run's
// lease and record, and each kind of delivery, how the delivery takes the
// run (or settles without it), and whether that cost a lease write.
func TestHoldDecisions(t *testing.T) {
	t.Parallel()
	const ackWait = 400 * time.Millisecond
	cases := []struct {
		name string
		// setup prepares the run "r" and publishes its task; it returns
		// which delivery is judged.
		setup func(r *rig) func(int) bool
		want  string
		// write: the delivery wrote the lease record (a takeover).
		write bool
		check func(t *testing.T, r *rig, o holdOutcome)
	}{{
		name: "first delivery of the start task: fresh, reads and writes nothing",
		setup: func(r *rig) func(int) bool {
			r.start("r", `{}`)
			return first
		},
		want: "fresh",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Zero(t, o.h.lease.rev, "a fresh holder fences on 'no lease record'")
			require.Nil(t, o.h.history.lease)
		},
	}, {
		name: "wake finding the lease parked by another task: clean, at its revision",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 2, Waits: []string{"r.a.0"}})
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			return first
		},
		want: "clean",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Equal(t, 2, o.h.lease.found.Epoch)
			require.False(t, o.h.inherited)
		},
	}, {
		name: "wake finding no lease record: inherited (the holder before may have run a step)",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "", "r.sweep")
			return first
		},
		want: "inherited",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.True(t, o.h.rebegin, "a wake that names no step (a sweep) begins every await again")
		},
	}, {
		name: "wake finding the lease released by another task's delivery: inherited, at its revision",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.putLease("r", state.Lease{State: state.LeaseReleased, Seq: 999, Delivered: 3})
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			return first
		},
		want: "inherited",
	}, {
		name: "redelivery of a start task whose first delivery wrote no lease: taken over at once",
		setup: func(r *rig) func(int) bool {
			r.start("r", `{}`)
			return second
		},
		want: "taken over", write: true,
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Less(t, o.took, ackWait, "a lease without a record is taken without waiting")
		},
	}, {
		name: "redelivery finding the lease parked by the delivery just before (its look found the await decided, or a crash before the ack): taken over as a clean holder",
		setup: func(r *rig) func(int) bool {
			r.start("r", `{}`)
			_, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: seq, Delivered: 1, Epoch: 1, Waits: []string{"r.x.0"}})
			return second
		},
		want: "clean", write: true,
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Less(t, o.took, ackWait, "a parked lease is no live holder's")
			require.False(t, o.h.inherited, "the parked delivery started nothing after its park")
			require.True(t, o.h.lease.written, "taken with a write: the parked delivery may still acknowledge the message")
		},
	}, {
		name: "later redelivery finding the lease parked by a delivery before the one just before: taken over at once",
		setup: func(r *rig) func(int) bool {
			r.start("r", `{}`)
			_, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: seq, Delivered: 1, Epoch: 1, Waits: []string{"r.x.0"}})
			return func(delivered int) bool { return delivered == 3 }
		},
		want: "taken over", write: true,
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Less(t, o.took, ackWait, "a parked lease is no live holder's")
			require.True(t, o.h.inherited, "the delivery before may have taken the run without a write and started a step")
		},
	}, {
		name: "redelivery finding the lease held by its own first delivery (a crash mid-step): taken over after a whole AckWait",
		setup: func(r *rig) func(int) bool {
			r.start("r", `{}`)
			_, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: seq, Delivered: 1})
			return second
		},
		want: "taken over", write: true,
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.GreaterOrEqual(t, o.took, ackWait, "a crashed holder and a stalled one look alike: the lease is waited out")
		},
	}, {
		name: "the delivery just before handed the task back unstarted: taken as it found it",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			task, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			require.True(r.t, task.Wake)
			r.putLease("r", state.Lease{State: state.LeaseReleased, Seq: seq, Delivered: 1, Unstarted: true, Clean: true, Epoch: 3})
			return second
		},
		want: "clean",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			require.Equal(t, 3, o.h.lease.found.Epoch)
		},
	}, {
		name: "a delivery two after the unstarted hand-back: takes over with a write",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			_, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			r.putLease("r", state.Lease{State: state.LeaseReleased, Seq: seq, Delivered: 1, Unstarted: true, Clean: true})
			return func(delivered int) bool { return delivered == 3 }
		},
		want: "taken over", write: true,
	}, {
		name: "a later delivery of this very task holds the lease: lost",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			_, seq, _ := r.pending(jetstream.RunSubject(wf, "r"))
			r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: seq, Delivered: 5})
			return first
		},
		want: "lost",
	}, {
		name: "lease and record cancelled: dropped",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			_, _, err := r.store.Cancel(r.ctx(), "r")
			require.NoError(r.t, err)
			return first
		},
		want: "drop",
	}, {
		name: "lease cancelled, record still running, first delivery: released (a cancel under way)",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			r.putLease("r", state.Lease{State: state.LeaseCancelled})
			return first
		},
		want: "release",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			run, _ := r.runRecord("r")
			require.Equal(t, state.StatusRunning, run.Status, "the first delivery leaves the cancel to its canceller")
		},
	}, {
		name: "lease cancelled, record still running, redelivery: finishes the cancel and drops",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			r.putLease("r", state.Lease{State: state.LeaseCancelled})
			return second
		},
		want: "drop",
		check: func(t *testing.T, r *rig, o holdOutcome) {
			run, _ := r.runRecord("r")
			require.Equal(t, state.StatusCancelled, run.Status)
		},
	}, {
		name: "task of a run that ended: dropped before any lease is read",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			_, _, err := r.store.Finish(r.ctx(), run, rev, func(run *state.Run) { run.Status = state.StatusCompleted })
			require.NoError(r.t, err)
			return first
		},
		want: "drop",
	}, {
		name:  "start task of another token finding the lease parked by another task: a stray, dropped unreplayed",
		setup: startTaskFinding(&state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 1, Waits: []string{"r.a.0"}}, "dup"),
		want:  "stray",
	}, {
		name:  "the run's own start task, published late, finding the lease parked by a wake's holder: a stray",
		setup: startTaskFinding(&state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 1, Waits: []string{"r.a.0"}}, ""),
		want:  "stray",
	}, {
		name:  "the run's own start task finding a lease it did not write: not fresh, inherited (a wake held the run first)",
		setup: startTaskFinding(&state.Lease{State: state.LeaseReleased, Seq: 999, Delivered: 1}, ""),
		want:  "inherited",
	}, {
		name:  "start task of another token, run never held: the run's only task, inherited (its publisher died before the record)",
		setup: startTaskFinding(nil, "died"),
		want:  "inherited",
	}, {
		name: "wake of another generation: dropped",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", func(run *state.Run) { run.Generation = 1 })
			old := run
			old.Generation = 0
			r.wake(old, rev, "r.a.0", "r.a.0.wake")
			return first
		},
		want: "drop",
	}, {
		name: "wake of a run of an earlier version's executor: left to its workers",
		setup: func(r *rig) func(int) bool {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake") // published as this version's wake
			_, _, err := r.store.Update(r.ctx(), "r", func(run *state.Run) (bool, error) { run.Exec = 0; return true, nil })
			require.NoError(r.t, err)
			return first
		},
		want: "drop",
	}, {
		name: "wake of a run ID whose record is gone: dropped",
		setup: func(r *rig) func(int) bool {
			run := state.Run{V: state.Version, RunID: "r", Workflow: wf, Status: state.StatusRunning, Token: "t", Exec: state.ExecLease}
			r.wake(run, 1, "r.a.0", "r.a.0.wake")
			return first
		},
		want: "drop",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, ackWait)
			judge := tc.setup(r)
			_, before := r.lease("r")
			e := r.executor("judge", noBody, nil)
			o := await(r, r.holdProbe(e, judge, nil), "the judged delivery")
			require.Equal(t, tc.want, o.verdict(), "settlement error: %v", errOf(o.s))
			if o.s == nil {
				_, after := r.lease("r")
				if tc.write {
					require.Greater(t, after, before, "the lease was not written")
					l, _ := r.lease("r")
					require.Equal(t, state.LeaseHeld, l.State)
					require.Equal(t, "judge", l.Worker)
					require.Equal(t, o.seq, l.Seq)
					require.Equal(t, o.delivered, l.Delivered)
					require.Equal(t, after, o.h.lease.rev, "the holder fences on the revision it wrote")
				} else {
					require.Equal(t, before, after, "the lease was written")
					require.Equal(t, before, o.h.lease.rev, "the holder fences on the revision it found")
				}
			}
			if tc.check != nil {
				tc.check(t, r, o)
			}
		})
	}
}

func errOf(s *settlement) error {
	if s == nil {
		return nil
	}
	return s.err
}

// A redelivery that finds the lease held by a delivery that keeps renewing
// it waits, takes nothing over, and hands its task back (released after a
// millisecond) once that holder parks the run.
func TestRedeliveryWaitsOutALiveHolder(t *testing.T) {
	t.Parallel()
	const ackWait = 400 * time.Millisecond
	r := newRig(t, ackWait)
	run, rev := r.createRun("r", nil)
	r.wake(run, rev, "r.a.0", "r.a.0.wake")
	r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 1, Worker: "alive"})

	// The live holder renews every eighth of an AckWait for three
	// AckWaits (a waiter that took over after one unchanged AckWait would
	// be seen), then parks.
	type park struct {
		rev uint64
		at  time.Time
	}
	parked := make(chan park, 1)
	go func() {
		tick := time.NewTicker(ackWait / 8)
		defer tick.Stop()
		end := time.Now().Add(3 * ackWait)
		for time.Now().Before(end) {
			select {
			case <-r.t.Context().Done():
				return
			case <-tick.C:
			}
			r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 1, Worker: "alive"})
		}
		at := time.Now()
		parked <- park{r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Worker: "alive", Epoch: 1}), at}
	}()
	e := r.executor("waiter", noBody, nil)
	decided := make(chan time.Time, 1)
	o := await(r, r.holdProbe(e, first, func(holdOutcome) { decided <- time.Now() }), "the waiter's decision")
	p := await(r, parked, "the park")
	require.Equal(t, "release", o.verdict(), "%v", errOf(o.s))
	require.Equal(t, time.Millisecond, o.s.delay, "handed back at once, to be judged again")
	require.True(t, (<-decided).After(p.at), "the waiter decided before the holder parked")
	l, lrev := r.lease("r")
	require.Equal(t, p.rev, lrev, "the waiter wrote the lease")
	require.Equal(t, "alive", l.Worker)
}

// A redelivery that finds the lease held by a delivery that stopped
// renewing it takes it over once the record has gone a whole AckWait
// unchanged by its own clock, not before, with a compare-and-set write.
func TestRedeliveryTakesOverAStaleLease(t *testing.T) {
	t.Parallel()
	const ackWait = 200 * time.Millisecond
	r := newRig(t, ackWait)
	run, rev := r.createRun("r", nil)
	r.wake(run, rev, "r.a.0", "r.a.0.wake")
	stale := r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 1, Worker: "stalled", Epoch: 4, Passed: 6})
	// A step the stalled holder committed under its lease before it
	// stalled: the taker's history, read after its takeover, holds it.
	r.commitStep("r", "r.a.0", `"a"`)

	e := r.executor("taker", noBody, nil)
	o := await(r, r.holdProbe(e, first, func(holdOutcome) {}), "the takeover")
	require.Equal(t, "taken over", o.verdict(), "%v", errOf(o.s))
	require.GreaterOrEqual(t, o.took, ackWait, "taken over before a whole AckWait without renewal")
	l, lrev := r.lease("r")
	require.Greater(t, lrev, stale)
	require.Equal(t, state.LeaseHeld, l.State)
	require.Equal(t, "taker", l.Worker)
	require.Equal(t, 4, l.Epoch, "a takeover keeps the epoch the run was parked at")
	require.Equal(t, 6, l.Passed, "a takeover keeps the awaits passed before it")
	require.Equal(t, lrev, o.h.lease.rev)
	require.NotNil(t, o.h.history.get("r.a.0"), "the history read after the takeover misses a commit of the holder before")
	require.True(t, o.h.inherited)
}

// A redelivery waiting for a held lease drops its task when the run ends
// meanwhile.
func TestRedeliveryWaitingDropsWhenTheRunEnds(t *testing.T) {
	t.Parallel()
	const ackWait = 400 * time.Millisecond
	r := newRig(t, ackWait)
	run, rev := r.createRun("r", nil)
	r.wake(run, rev, "r.a.0", "r.a.0.wake")
	r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 1})
	e := r.executor("waiter", noBody, nil)
	judged := r.holdProbe(e, first, func(o holdOutcome) { e.settleRun(o.d, nil, o.s) })
	_, _, err := r.store.Finish(r.ctx(), run, rev, func(run *state.Run) { run.Status = state.StatusCompleted })
	require.NoError(t, err)
	o := await(r, judged, "the waiter's decision")
	require.Equal(t, "drop", o.verdict(), "%v", errOf(o.s))
	require.Less(t, o.took, ackWait, "it waited for a takeover instead of reading the run's end")
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return !ok }, "the dropped task was not acknowledged")
}

// holdFresh takes the lease of a fresh run "r" (its start task's first
// delivery) and runs f with the holder inside the delivery; the task is
// released afterwards unless f settled it (returns true).
func holdFresh(t *testing.T, r *rig, e *Executor, f func(o holdOutcome) bool) {
	t.Helper()
	r.start("r", `{}`)
	done := make(chan struct{})
	var once atomic.Bool
	r.serveHandlers(1, false, probe(func(ctx context.Context, m *consume.Delivery) {
		if once.Swap(true) {
			_ = m.Msg.Term() // a redelivery after f: not judged
			return
		}
		defer close(done)
		o, untrack := e.tryHold(ctx, m)
		defer untrack()
		o.seq, o.delivered = meta(t, m)
		require.Equal(t, "fresh", o.verdict())
		if !f(o) {
			_ = m.Msg.Nak()
		}
	}), nil)
	await(r, done, "the fresh delivery")
}

// The lease's own decisions, on a fresh holder: a commit fenced by the
// lease is accepted while the lease is this holder's, and refused once
// another delivery wrote it (lost: the delivery's context is cancelled
// with errLeaseLost, and nothing more is started) or a cancel did
// (errLeaseCancelled, the context's cause ErrRunCancelled).
func TestLeaseCommitIsFenced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		move  func(r *rig)
		err   error
		cause error
	}{
		{"taken over by another delivery", func(r *rig) {
			r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 2, Worker: "other"})
		}, errLeaseLost, errLeaseLost},
		{"cancelled", func(r *rig) {
			_, _, err := r.store.Cancel(r.ctx(), "r")
			require.NoError(r.t, err)
		}, errLeaseCancelled, ErrRunCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			e := r.executor("holder", noBody, nil)
			holdFresh(t, r, e, func(o holdOutcome) bool {
				l := o.h.lease
				rec, err := state.Encode(state.Step{V: state.Version, StepID: "r.a.0", RunID: "r", Name: "a", Attempt: 1})
				require.NoError(t, err)
				rev, err := l.commit("r.a.0", rec)
				require.NoError(t, err, "the holder's own fence")
				require.NotZero(t, rev)
				require.NoError(t, o.d.ctx.Err())

				tc.move(r)
				_, err = l.commit("r.b.0", rec)
				require.ErrorIs(t, err, tc.err)
				require.Nil(t, r.step("r.b.0"), "a commit past the fence was stored")
				require.ErrorIs(t, context.Cause(o.d.ctx), tc.cause, "the delivery's context is not cancelled")
				require.ErrorIs(t, l.live(), tc.err, "a lost lease lets the holder start a step")
				_, err = l.park(1, []*Pending{{id: "r.c.0"}}, nil, true, true)
				require.ErrorIs(t, err, tc.err, "a lost lease parks")
				require.NotNil(t, r.step("r.a.0"))
				return true // lost or cancelled: the message is not the holder's to settle
			})
		})
	}
}

// A holder proves its lease by its delivery and by every accepted write:
// live costs nothing while the proof is younger than two thirds of an
// AckWait, and renews the lease (a held record) once it is older. A
// heartbeat renews it too, and keeps the epoch the holder found.
func TestLeaseLiveRenewsAnOldProof(t *testing.T) {
	t.Parallel()
	const ackWait = 300 * time.Millisecond
	r := newRig(t, ackWait)
	e := r.executor("holder", noBody, nil)
	holdFresh(t, r, e, func(o holdOutcome) bool {
		l := o.h.lease
		require.NoError(t, l.live())
		rec, rev := r.lease("r")
		require.Nil(t, rec, "a fresh proof was renewed")
		require.Zero(t, rev)

		// Age the proof past its validity.
		l.mu.Lock()
		l.proved = time.Now().Add(-l.validFor())
		l.mu.Unlock()
		require.NoError(t, l.live())
		rec, rev = r.lease("r")
		require.NotNil(t, rec, "an old proof was not renewed")
		require.Equal(t, state.LeaseHeld, rec.State)
		require.Equal(t, "holder", rec.Worker)
		require.Equal(t, o.seq, rec.Seq)
		require.Equal(t, 1, rec.Delivered)
		require.Equal(t, rev, l.rev)

		l.beat()
		_, again := r.lease("r")
		require.Greater(t, again, rev, "a heartbeat did not renew the lease")
		require.Equal(t, again, l.rev)
		return false
	})
}

// A paused worker (Hooks.NoHeartbeat) renews nothing at its heartbeats.
func TestLeaseBeatOfAPausedWorkerWritesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	e := r.executor("paused", noBody, func(c *Config) { c.Hooks.NoHeartbeat = true })
	holdFresh(t, r, e, func(o holdOutcome) bool {
		o.h.lease.beat()
		rec, _ := r.lease("r")
		require.Nil(t, rec)
		return false
	})
}

// How a holder leaves its lease: parked (epoch, waits, all), released, or
// handed over (unstarted, inherited); a release by a holder that never
// wrote a record writes nothing (its redelivery finds no holder), and a
// heartbeat after the holder settled writes nothing over its settlement.
func TestLeaseSettlementRecords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		settle func(l *lease)
		want   *state.Lease // nil: no record
	}{
		{"park on all of two steps", func(l *lease) {
			_, err := l.park(2, []*Pending{{id: "r.a.0"}, {id: "r.b.0", seq: 1}}, nil, true, true)
			require.NoError(t, err)
		}, &state.Lease{State: state.LeaseParked, Epoch: 2, Waits: []string{"r.a.0", "r.b.0"}, All: true}},
		{"park on the first of two steps", func(l *lease) {
			_, err := l.park(1, []*Pending{{id: "r.a.0"}, {id: "r.b.0", seq: 1}}, nil, false, true)
			require.NoError(t, err)
		}, &state.Lease{State: state.LeaseParked, Epoch: 1, Waits: []string{"r.a.0", "r.b.0"}}},
		{"release without a record", func(l *lease) { l.release() }, nil},
		{"release after a renewal", func(l *lease) {
			l.mu.Lock()
			require.NoError(t, l.writeLocked(state.LeaseHeld, 0, nil))
			l.mu.Unlock()
			l.release()
		}, &state.Lease{State: state.LeaseReleased}},
		{"hand over, inherited", func(l *lease) { l.handOver(true) },
			&state.Lease{State: state.LeaseReleased, Unstarted: true, Inherited: true}},
		{"hand over, clean", func(l *lease) { l.handOver(false) },
			&state.Lease{State: state.LeaseReleased, Unstarted: true}},
		{"renew and release after passing awaits: the most passed", func(l *lease) {
			l.pass(3)
			l.pass(2)
			l.mu.Lock()
			require.NoError(t, l.writeLocked(state.LeaseHeld, 0, nil))
			l.mu.Unlock()
			l.release()
		}, &state.Lease{State: state.LeaseReleased, Passed: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			e := r.executor("holder", noBody, nil)
			holdFresh(t, r, e, func(o holdOutcome) bool {
				tc.settle(o.h.lease)
				rec, rev := r.lease("r")
				o.h.lease.beat() // after settling: must write nothing
				_, after := r.lease("r")
				require.Equal(t, rev, after, "a heartbeat after the settlement wrote the lease")
				if tc.want == nil {
					require.Nil(t, rec)
					return false
				}
				require.NotNil(t, rec)
				require.Equal(t, tc.want.State, rec.State)
				require.Equal(t, tc.want.Epoch, rec.Epoch)
				require.Equal(t, tc.want.Waits, rec.Waits)
				require.Equal(t, tc.want.All, rec.All)
				require.Equal(t, tc.want.Unstarted, rec.Unstarted)
				require.Equal(t, tc.want.Inherited, rec.Inherited)
				require.Equal(t, tc.want.Passed, rec.Passed)
				require.Equal(t, o.seq, rec.Seq)
				require.Equal(t, "holder", rec.Worker)
				return false
			})
		})
	}
}

// Executor.release, a run task handed back unstarted (a stopping pool's):
// the lease records how the delivery found the run, so that the next
// delivery takes it the same way and counts no attempt; a lease another
// delivery holds is left alone.
func TestHandBackRecordsHowTheRunWasFound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(r *rig) // publishes the run task
		want  *state.Lease // nil: the lease is left as it was
	}{
		{"a fresh start task: clean", func(r *rig) { r.start("r", `{}`) },
			&state.Lease{State: state.LeaseReleased, Unstarted: true, Clean: true}},
		{"a wake finding no lease: inherited", func(r *rig) {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "", "r.sweep")
		}, &state.Lease{State: state.LeaseReleased, Unstarted: true, Inherited: true}},
		{"a wake finding the run parked by another task: clean at its epoch", func(r *rig) {
			run, rev := r.createRun("r", nil)
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 5})
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
		}, &state.Lease{State: state.LeaseReleased, Unstarted: true, Clean: true, Epoch: 5, Passed: 4}},
		{"a wake finding the lease held by another delivery: left alone", func(r *rig) {
			run, rev := r.createRun("r", nil)
			r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 1})
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
		}, nil},
		{"a cancelled run: left alone", func(r *rig) {
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "r.a.0", "r.a.0.wake")
			_, _, err := r.store.Cancel(r.ctx(), "r")
			require.NoError(r.t, err)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			var released atomic.Value
			e := r.executor("stopping", noBody, func(c *Config) {
				c.Hooks.AfterRelease = func(runID string) { released.Store(runID) }
			})
			tc.setup(r)
			before, beforeRev := r.lease("r")
			got := make(chan int, 1)
			r.serveHandlers(1, false, probe(func(_ context.Context, m *consume.Delivery) {
				_, delivered := meta(t, m)
				if delivered == 1 {
					require.NoError(t, e.release(m.Msg, 0))
					return
				}
				got <- delivered
				_ = m.Msg.Ack()
			}), nil)
			require.Equal(t, 2, await(r, got, "the redelivery of the task handed back"))
			require.Equal(t, "r", released.Load(), "Hooks.AfterRelease")
			rec, rev := r.lease("r")
			if tc.want == nil {
				require.Equal(t, beforeRev, rev, "the lease was written")
				require.Equal(t, before, rec)
				return
			}
			require.NotNil(t, rec)
			require.Equal(t, tc.want.State, rec.State)
			require.Equal(t, tc.want.Unstarted, rec.Unstarted)
			require.Equal(t, tc.want.Clean, rec.Clean)
			require.Equal(t, tc.want.Inherited, rec.Inherited)
			require.Equal(t, tc.want.Epoch, rec.Epoch)
			require.Equal(t, tc.want.Passed, rec.Passed, "the awaits passed before")
			require.Equal(t, 1, rec.Delivered)
			require.Equal(t, "stopping", rec.Worker)
		})
	}
}

// A holder that stalls (its worker paused: no ack extension, no lease
// renewal) loses its run to the redelivery of its task on another worker,
// which runs the step again under the same step ID and commits it; the
// stalled holder's own commit, when its step returns, is refused by the
// fence, and it leaves the task message alone. One result is the step's.
func TestStalledHoldersCommitIsRefused(t *testing.T) {
	t.Parallel()
	const ackWait = 300 * time.Millisecond
	r := newRig(t, ackWait)
	release := make(chan struct{})
	var calls atomic.Int32
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		out, err := seqStep(c, "a", func(ctx context.Context) (json.RawMessage, error) {
			info, _ := InfoFrom(ctx)
			if calls.Add(1) == 1 {
				<-release // the stalled worker's step: it returns after the takeover
			}
			return json.Marshal(fmt.Sprintf("attempt %d", info.Attempt))
		})
		if err != nil {
			return nil, err
		}
		_, err = seqStep(c, "b", ok(`"b"`))
		return out, err
	}
	type commit struct {
		worker string
		won    bool
	}
	commits := make(chan commit, 8)
	hook := func(worker string) func(*Config) {
		return func(c *Config) {
			c.Hooks.AfterCommit = func(stepID string, won bool) {
				if stepID == "r.a.0" {
					commits <- commit{worker, won}
				}
			}
		}
	}
	stalled := r.executor("stalled", body, func(c *Config) {
		hook("stalled")(c)
		c.Hooks.NoHeartbeat = true
	})
	r.serve(stalled, 1, true)
	r.start("r", `{}`)
	r.eventually(func() bool { return calls.Load() == 1 }, "the step did not start")
	live := r.executor("live", body, hook("live"))
	r.serve(live, 1, false)

	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.Equal(t, commit{"live", true}, await(r, commits, "the live worker's commit"))
	close(release)
	require.Equal(t, commit{"stalled", false}, await(r, commits, "the stalled worker's refused commit"))
	rec := r.step("r.a.0")
	require.Equal(t, "live", rec.Worker)
	require.Equal(t, 2, rec.Attempt, "the taker's attempt counts the stalled one")
	require.JSONEq(t, `"attempt 2"`, string(end.Output))
	l, _ := r.lease("r")
	require.Equal(t, "live", l.Worker)
}

// A delivery handed back unstarted (a worker stopping) keeps on the lease
// what the run's last park waited for, and where: the next holder compares
// its body with those steps (history.awaiting), which a record without
// them would lose.
func TestHandBackKeepsWhatTheParkWaitedFor(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	e := r.executor("w1", noBody, nil)
	parked := state.Lease{State: state.LeaseParked, Seq: 1, Delivered: 1, Epoch: 2, Waits: []string{"r.nap.0"}, Places: []int{3}, Began: true}
	r.putLease("r", parked)
	task := state.Task{V: state.Version, RunID: "r", Workflow: "w", Wake: true, Token: "t"}
	require.NoError(t, e.handBack(r.ctx(), task, 2, 1))
	l, _ := r.lease("r")
	require.Equal(t, state.LeaseReleased, l.State)
	require.Equal(t, parked.Waits, l.Waits)
	require.Equal(t, parked.Places, l.Places)
	require.True(t, l.Began)
	h := newHistory()
	h.awaiting(*l)
	require.Equal(t, awaitedStep{id: "r.nap.0"}, h.awaited[3])
}
