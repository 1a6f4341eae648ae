package workflow

// Settlements: how a run task's and a branch task's delivery is settled
// for each kind of outcome (settleRun, settleBranch) — the record written,
// the lease left, the wake published, and what happens to the message:
// acknowledged, handed back, or left alone.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// redelivery is a later delivery of a task a settle test settled, and how
// long after the settled delivery's arrival it came.
type redelivery struct {
	delivered int
	after     time.Duration
}

// settleFresh takes the lease of a fresh run "r" with e, prepares the
// holder with prepare (may be nil), settles the delivery with the
// settlement s returns, and reports every later delivery of the task
// (terminated at once).
func settleFresh(t *testing.T, r *rig, e *Executor, prepare func(o holdOutcome), s func(o holdOutcome) *settlement) <-chan redelivery {
	t.Helper()
	r.start("r", `{}`)
	later := make(chan redelivery, 4)
	settled := make(chan struct{})
	var received time.Time
	var once atomic.Bool
	r.serveHandlers(1, false, probe(func(ctx context.Context, m *consume.Delivery) {
		if once.Swap(true) {
			_, delivered := meta(t, m)
			later <- redelivery{delivered, m.Received.Sub(received)}
			_ = m.Msg.Term()
			return
		}
		defer close(settled)
		received = m.Received
		o, untrack := e.tryHold(ctx, m)
		defer untrack()
		o.seq, o.delivered = meta(t, m)
		require.Equal(t, "fresh", o.verdict())
		if prepare != nil {
			prepare(o)
		}
		e.settleRun(o.d, o.h.holder, s(o))
	}), nil)
	await(r, settled, "the settlement")
	return later
}

// acked waits until subject holds no task: the message was acknowledged
// (or terminated).
func (r *rig) acked(subject string) {
	r.t.Helper()
	r.eventually(func() bool { _, _, ok := r.pending(subject); return !ok }, "the task on %s was not acknowledged", subject)
}

// A finished body writes the run's end: completed with its output, or
// failed with the kind, fatality and code of what it returned; then the
// task is acknowledged.
func TestSettleFinish(t *testing.T) {
	t.Parallel()
	big := json.RawMessage(`"` + strings.Repeat("x", state.MaxInputBytes) + `"`)
	for _, tc := range []struct {
		name   string
		s      settlement
		status state.Status
		kind   string
		fatal  bool
		code   string
	}{
		{name: "output", s: settlement{output: json.RawMessage(`{"n":1}`)}, status: state.StatusCompleted},
		{name: "a workflow error", s: settlement{err: errors.New("bad")}, status: state.StatusFailed, kind: "workflow"},
		{name: "a fatal coded error", s: settlement{err: fmt.Errorf("wrapped: %w", fatal{"gone"})}, status: state.StatusFailed,
			kind: "workflow", fatal: true, code: "gone"},
		{name: "undecodable input", s: settlement{err: fmt.Errorf("%w: not an order", ErrInput)}, status: state.StatusFailed,
			kind: "input", fatal: true},
		{name: "a panic", s: settlement{panic: true, err: errors.New("workflow panicked: boom")}, status: state.StatusFailed,
			kind: "panic", fatal: true},
		{name: "a step's committed failure", s: settlement{err: &StepError{StepID: "r.a.0", StepName: "a", Attempts: 3, Code: "declined", Message: "no"}},
			status: state.StatusFailed, kind: "step", code: "declined"},
		{name: "output over the limit", s: settlement{output: big}, status: state.StatusFailed, kind: "output", fatal: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			hk := newHooked()
			e := r.executor("w1", noBody, hk.install)
			later := settleFresh(t, r, e, nil, func(holdOutcome) *settlement {
				s := tc.s
				s.kind = settleFinish
				return &s
			})
			require.Equal(t, "r", await(r, hk.finishes, "Hooks.AfterFinish"))
			r.acked(jetstream.RunSubject(wf, "r"))
			end, _ := r.runRecord("r")
			require.Equal(t, tc.status, end.Status)
			if tc.status == state.StatusCompleted {
				require.JSONEq(t, string(tc.s.output), string(end.Output))
				require.Nil(t, end.Error)
			} else {
				require.NotNil(t, end.Error)
				require.Equal(t, tc.kind, end.Error.Kind)
				require.Equal(t, tc.fatal, end.Error.Fatal)
				require.Equal(t, tc.code, end.Error.Code)
				require.Nil(t, end.Output)
			}
			select {
			case d := <-later:
				t.Fatalf("a finished run's task was delivered again: %+v", d)
			default:
			}
		})
	}
}

// A parked run: the lease written parked with the await's epoch and
// waits (all of them, or any), then one more look at what it waits for,
// before the acknowledgement. Nothing committed, or not all of an
// AwaitAll: the task is acknowledged and nothing wakes the run. A wait
// committed meanwhile (its wake absorbed by this very task): the task is
// handed back at once, not acknowledged, and its redelivery takes the run
// on; no wake is published.
func TestSettlePark(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		waits     []string
		first     bool
		committed []string
		wake      bool
	}{
		{"nothing committed", []string{"r.a.0"}, false, nil, false},
		{"the wait committed before the look", []string{"r.a.0"}, false, []string{"r.a.0"}, true},
		{"all of two, one committed", []string{"r.a.0", "r.b.0"}, false, []string{"r.a.0"}, false},
		{"all of two, both committed", []string{"r.a.0", "r.b.0"}, false, []string{"r.a.0", "r.b.0"}, true},
		{"the first of two, one committed", []string{"r.a.0", "r.b.0"}, true, []string{"r.b.0"}, true},
		{"the first of two, none committed", []string{"r.a.0", "r.b.0"}, true, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			hk := newHooked()
			e := r.executor("w1", noBody, hk.install)
			later := settleFresh(t, r, e, func(holdOutcome) {
				for _, id := range tc.committed {
					r.commitStep("r", id, `1`)
				}
			}, func(holdOutcome) *settlement {
				s := &settlement{kind: settlePark, epoch: 2, first: tc.first}
				for _, id := range tc.waits {
					s.waits = append(s.waits, &Pending{id: id})
				}
				return s
			})
			if !tc.wake {
				require.Equal(t, tc.waits, await(r, hk.parks, "Hooks.AfterPark"))
			}
			l, _ := r.lease("r")
			require.Equal(t, state.LeaseParked, l.State)
			require.Equal(t, 2, l.Epoch)
			require.Equal(t, tc.waits, l.Waits)
			require.Equal(t, !tc.first, l.All)
			require.Empty(t, r.tap.published("jetflow.run.")[1:], "the park published a wake")
			if !tc.wake {
				r.acked(jetstream.RunSubject(wf, "r"))
				return
			}
			d := await(r, later, "the handed-back task's redelivery")
			require.Equal(t, 2, d.delivered, "the parked task was handed back, not acknowledged")
			select {
			case waits := <-hk.parks:
				t.Fatalf("Hooks.AfterPark called for a park whose await was decided (%v)", waits)
			default:
			}
		})
	}
}

// A park whose lease moved under the holder is not a park: lost (another
// holder: the message is left alone) or dropped (cancelled).
func TestSettleParkOfALostLease(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", noBody, hk.install)
	later := settleFresh(t, r, e, func(holdOutcome) {
		r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999, Delivered: 2, Worker: "other"})
	}, func(holdOutcome) *settlement {
		return &settlement{kind: settlePark, epoch: 1, waits: []*Pending{{id: "r.a.0"}}}
	})
	l, _ := r.lease("r")
	require.Equal(t, "other", l.Worker, "the lost holder wrote the lease")
	require.Equal(t, state.LeaseHeld, l.State)
	select {
	case w := <-hk.parks:
		t.Fatalf("a lost holder parked the run (%v)", w)
	default:
	}
	// Left alone: the broker redelivers the message after its AckWait.
	d := await(r, later, "the redelivery of the lost holder's task")
	require.Equal(t, 2, d.delivered)
	// (9/10: the deadline runs from the server's send, Received from
	// the client's receipt.)
	require.GreaterOrEqual(t, d.after, r.ackWait*9/10, "the lost holder settled the message")
}

// The other run settlements: a release writes the lease released (when
// the holder wrote one) and hands the task back after the delay; a
// hand-over writes it unstarted; a drop acknowledges; a lost lease leaves
// the message alone, redelivered only after AckWait.
func TestSettleReleaseDropLost(t *testing.T) {
	t.Parallel()
	const ackWait = 400 * time.Millisecond
	for _, tc := range []struct {
		name    string
		written bool // the holder renewed its lease before settling
		s       settlement
		lease   *state.Lease // the record after (nil: none)
		// redelivered: the task comes again, at least after min and
		// before max after its first delivery (0: no redelivery)
		min, max time.Duration
	}{
		{name: "release, no record written", s: settlement{kind: settleRelease, delay: 5 * time.Millisecond},
			max: ackWait},
		{name: "release after a renewal", written: true, s: settlement{kind: settleRelease, delay: 5 * time.Millisecond},
			lease: &state.Lease{State: state.LeaseReleased}, max: ackWait},
		{name: "hand over", s: settlement{kind: settleRelease, handOver: true, delay: time.Millisecond},
			lease: &state.Lease{State: state.LeaseReleased, Unstarted: true}, max: ackWait},
		{name: "drop", s: settlement{kind: settleDrop}},
		{name: "lost", s: settlement{kind: settleLost, err: errLeaseLost}, min: ackWait * 9 / 10, max: 10 * ackWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, ackWait)
			e := r.executor("w1", noBody, nil)
			later := settleFresh(t, r, e, func(o holdOutcome) {
				if tc.written {
					o.h.lease.mu.Lock()
					require.NoError(t, o.h.lease.writeLocked(state.LeaseHeld, 0, nil))
					o.h.lease.mu.Unlock()
				}
			}, func(holdOutcome) *settlement { s := tc.s; return &s })
			l, _ := r.lease("r")
			if tc.lease == nil {
				require.Nil(t, l)
			} else {
				require.NotNil(t, l)
				require.Equal(t, tc.lease.State, l.State)
				require.Equal(t, tc.lease.Unstarted, l.Unstarted)
			}
			if tc.max == 0 {
				r.acked(jetstream.RunSubject(wf, "r"))
				return
			}
			d := await(r, later, "the redelivery")
			require.Equal(t, 2, d.delivered)
			require.GreaterOrEqual(t, d.after, tc.min)
			require.Less(t, d.after, tc.max, "handed back late: left for the broker's redelivery")
		})
	}
}

// branchSettle publishes the branch task of step x of running run "r"
// (fanOut's) and settles its first delivery with s.
func branchSettle(t *testing.T, r *rig, e *Executor, s *settlement) {
	t.Helper()
	run, rev := r.runRecord("r")
	task := state.StepTask(run, rev, "r.x.0")
	task.Width = 2
	r.publish(jetstream.BranchSubject(wf, "r.x.0"), "r.x.0", task)
	settled := make(chan struct{})
	var once atomic.Bool
	r.serveHandlers(1, false, nil, probe(func(ctx context.Context, m *consume.Delivery) {
		if once.Swap(true) {
			return // a redelivery: left alone (the test judges the first settlement)
		}
		defer close(settled)
		d := e.newDelivery(ctx, m)
		d.run, d.rev = state.RunFromTask(d.task), d.task.Rev
		e.settleBranch(d, s)
	}))
	await(r, settled, "the branch's settlement")
}

// A branch whose step is committed wakes its run only when the run needs
// it: parked on the branch (any), or parked on all of several whose others
// are committed too. It needs none while the lease is not parked (its
// holder, or the next one, reads the commit), nor while another step of an
// AwaitAll is missing (the last one's commit wakes the run). Either way
// the task is acknowledged.
func TestSettleBranchDoneWakesOnlyWhenNeeded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		lease     *state.Lease
		committed []string
		wake      bool
	}{
		{"no lease: the first holder at work", nil, nil, false},
		{"lease held", &state.Lease{State: state.LeaseHeld, Seq: 1, Delivered: 1}, nil, false},
		{"lease released", &state.Lease{State: state.LeaseReleased, Seq: 1, Delivered: 1}, nil, false},
		{"parked on any", &state.Lease{State: state.LeaseParked, Waits: []string{"r.x.0", "r.y.0"}}, nil, true},
		{"parked on all, the other missing", &state.Lease{State: state.LeaseParked, Waits: []string{"r.x.0", "r.y.0"}, All: true}, nil, false},
		{"parked on all, the other committed", &state.Lease{State: state.LeaseParked, Waits: []string{"r.x.0", "r.y.0"}, All: true},
			[]string{"r.y.0"}, true},
		{"parked on all, this one alone", &state.Lease{State: state.LeaseParked, Waits: []string{"r.x.0"}, All: true}, nil, true},
		{"parked on something else", &state.Lease{State: state.LeaseParked, Waits: []string{"r.q.0"}, All: true}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			r.createRun("r", nil)
			if tc.lease != nil {
				r.putLease("r", *tc.lease)
			}
			for _, id := range tc.committed {
				r.commitStep("r", id, `1`)
			}
			rec := &state.Step{StepID: "r.x.0"}
			branchSettle(t, r, r.executor("w1", noBody, nil), &settlement{kind: settleDone, rec: rec})
			r.acked(jetstream.BranchSubject(wf, "r.x.0"))
			wakes := r.tap.published("jetflow.run.")
			if !tc.wake {
				require.Empty(t, wakes)
				return
			}
			require.Len(t, wakes, 1)
			require.Equal(t, "r.x.0.wake", wakes[0].Header.Get("Nats-Msg-Id"))
			w := r.tap.tasks(wakes)[0]
			require.True(t, w.Wake)
			require.Equal(t, "r.x.0", w.StepID)
		})
	}
}

// A failed branch's retry: under 2 s a delayed nak (the failure logged,
// the task redelivered), from 2 s a branch timer carrying the next attempt
// and an acknowledgement.
func TestSettleBranchRetry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		delay time.Duration
		timer bool
	}{
		{"short: nak", 5 * time.Millisecond, false},
		{"long: timer", time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			r.createRun("r", nil)
			started := time.Now()
			branchSettle(t, r, r.executor("w1", noBody, nil), &settlement{kind: settleRetry, delay: tc.delay, attempt: 1,
				err: errors.New("flaky"), started: started, stepID: "r.x.0"})
			log := r.attempts("r.x.0")
			require.NotNil(t, log, "the failure was not logged")
			require.Equal(t, 1, log.Started)
			require.Len(t, log.Failures, 1)
			require.Equal(t, "flaky", log.Failures[0].Error)
			timers := r.timers()
			if !tc.timer {
				require.Empty(t, timers)
				_, _, pending := r.pending(jetstream.BranchSubject(wf, "r.x.0"))
				require.True(t, pending, "a nak'd branch task was acknowledged")
				return
			}
			require.Len(t, timers, 1)
			require.Equal(t, 2, timers["r.x.0"].Attempt)
			r.acked(jetstream.BranchSubject(wf, "r.x.0"))
		})
	}
}

// A park of a run cancelled under its holder is a drop: the lease stays
// cancelled, the task is acknowledged, and the run is neither parked nor
// woken.
func TestSettleParkOfACancelledRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", noBody, hk.install)
	later := settleFresh(t, r, e, func(holdOutcome) {
		_, _, err := r.store.Cancel(r.ctx(), "r")
		require.NoError(t, err)
		r.commitStep("r", "r.a.0", `1`) // what it waits for: no look, no wake
	}, func(holdOutcome) *settlement {
		return &settlement{kind: settlePark, epoch: 1, waits: []*Pending{{id: "r.a.0"}}}
	})
	r.acked(jetstream.RunSubject(wf, "r"))
	l, _ := r.lease("r")
	require.Equal(t, state.LeaseCancelled, l.State)
	select {
	case w := <-hk.parks:
		t.Fatalf("a cancelled run was parked (%v)", w)
	case d := <-later:
		t.Fatalf("a cancelled run's task came again: %+v", d)
	default:
	}
	require.Len(t, r.tap.published("jetflow.run."), 1, "a cancelled run was woken")
	end, _ := r.runRecord("r")
	require.Equal(t, state.StatusCancelled, end.Status)
}

// A park whose look found nothing and whose acknowledgement then took
// half of absorbLag or more (a stall here) looks once more after the
// acknowledgement: a wait committed meanwhile, whose committer may have
// stopped waiting for the parked task to go, wakes the run under
// <identity>.look.<park's revision>, delivered as a new task.
func TestSettleSlowParkLooksAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	e := r.executor("w1", noBody, func(c *Config) {
		hk.install(c)
		c.Hooks.BeforeParkAck = func(string) {
			r.commitStep("r", "r.a.0", `1`) // no wake: the committer gave up
			time.Sleep(absorbLag / 2)       // the stall this test is about
		}
	})
	later := settleFresh(t, r, e, nil, func(holdOutcome) *settlement {
		return &settlement{kind: settlePark, epoch: 2, waits: []*Pending{{id: "r.a.0"}}}
	})
	require.Equal(t, []string{"r.a.0"}, await(r, hk.parks, "Hooks.AfterPark"))
	_, rev := r.lease("r")
	wakes := r.tap.published("jetflow.run.")[1:]
	require.Len(t, wakes, 1, "the second look woke the run")
	require.Equal(t, "r.look."+strconv.FormatUint(rev, 10), wakes[0].Header.Get("Nats-Msg-Id"))
	d := await(r, later, "the wake's delivery")
	require.Equal(t, 1, d.delivered, "a new task, not the parked one again")
}
