package workflow

// Failure semantics: a retryable failure is retried in place (short
// backoff) or on a timer with the run parked (long backoff), a fatal one
// is committed at once, and attempts are bounded by MaxAttempts, counted
// per start of the step.

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// failing is a step function that fails with errs[i] on its call i (its
// attempt's number is read from its context) and returns "ok" after them.
func failing(calls *atomic.Int32, errs ...error) StepFunc {
	return func(ctx context.Context) (json.RawMessage, error) {
		i := int(calls.Add(1)) - 1
		if i < len(errs) {
			return nil, errs[i]
		}
		info, _ := InfoFrom(ctx)
		return json.Marshal(map[string]int{"attempt": info.Attempt})
	}
}

// oneStep is a body of one sequential step a under policy.
func oneStep(policy RetryPolicy, fn StepFunc) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return c.StepWithKey("a", policy, TaskKey{}, fn)
	}
}

// The decision table of a failed sequential step: how each failure is
// settled, which attempts run, and what the step's record and attempt log
// say. Every case runs in the delivery of the start task (no timer, no
// redelivery).
func TestSequentialStepFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		policy RetryPolicy
		errs   []error
		// attempts numbered; the record's attempt, failure and fatal flag
		attempts []int
		attempt  int
		failed   bool
		fatal    bool
		code     string
		// logged: the failed attempts in the record and its log
		logged []int
		// panics: the first call panics instead of failing
		panics bool
	}{
		{name: "success at once", attempts: []int{1}, attempt: 1},
		{name: "short RetryAfter: retried in place", errs: []error{retryIn(5 * time.Millisecond), retryIn(5 * time.Millisecond)},
			attempts: []int{1, 2, 3}, attempt: 3, logged: []int{1, 2}},
		{name: "policy backoff under 2s: retried in place", policy: RetryPolicy{InitialInterval: time.Millisecond},
			errs: []error{errors.New("flaky")}, attempts: []int{1, 2}, attempt: 2, logged: []int{1}},
		{name: "fatal: committed at once, with its code", errs: []error{fatal{"card_declined"}},
			attempts: []int{1}, attempt: 1, failed: true, fatal: true, code: "card_declined"},
		{name: "fatal after a retry", policy: RetryPolicy{InitialInterval: time.Millisecond},
			errs: []error{errors.New("flaky"), fatal{"gone"}}, attempts: []int{1, 2}, attempt: 2, failed: true, fatal: true, code: "gone", logged: []int{1}},
		{name: "out of attempts: the last failure committed", policy: RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond},
			errs: []error{errors.New("down"), errors.New("still down")}, attempts: []int{1, 2}, attempt: 2, failed: true, logged: []int{1}},
		{name: "one attempt: no retry", policy: RetryPolicy{MaxAttempts: 1},
			errs: []error{errors.New("down")}, attempts: []int{1}, attempt: 1, failed: true},
		{name: "a panic is a retryable failure", policy: RetryPolicy{InitialInterval: time.Millisecond},
			panics: true, attempts: []int{1, 2}, attempt: 2, logged: []int{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			hk := newHooked()
			var calls atomic.Int32
			fn := failing(&calls, tc.errs...)
			if tc.panics {
				fn = func(ctx context.Context) (json.RawMessage, error) {
					if calls.Add(1) == 1 {
						panic("boom")
					}
					return json.RawMessage(`{"attempt":2}`), nil
				}
			}
			e := r.executor("w1", oneStep(tc.policy, fn), hk.install)
			s := r.serveCounted(e, 1, true, false)
			r.start("r", `{}`)
			end := r.wait("r")

			require.Equal(t, tc.attempts, hk.attempts.of("r.a.0"))
			require.Equal(t, []int{1}, s.runs.of(jetstream.RunSubject(wf, "r")), "the run task was delivered again")
			require.Empty(t, r.tap.published("jetflow.sched."), "a timer for a short backoff")
			rec := r.step("r.a.0")
			require.NotNil(t, rec)
			require.Equal(t, tc.attempt, rec.Attempt)
			var failures []int
			for _, f := range rec.Failures {
				failures = append(failures, f.Attempt)
				require.Equal(t, "r.a.0", f.StepID)
				require.NotEmpty(t, f.Error)
				require.Equal(t, "w1", f.Worker)
			}
			require.Equal(t, tc.logged, failures, "the record's earlier failures")
			log := r.attempts("r.a.0")
			if tc.logged == nil {
				require.Nil(t, log, "an attempt log for a step that failed no retry")
			} else {
				require.Equal(t, tc.attempt, log.Started)
				require.Len(t, log.Failures, len(tc.logged))
				require.True(t, log.NotBefore.IsZero(), "an in-place retry waits for no timer")
			}
			if !tc.failed {
				require.Nil(t, rec.Error)
				require.Equal(t, state.StatusCompleted, end.Status)
				require.JSONEq(t, `{"attempt":`+jsonInt(int64(tc.attempt))+`}`, string(end.Output))
				return
			}
			require.NotNil(t, rec.Error)
			require.Equal(t, tc.fatal, rec.Error.Fatal)
			require.Equal(t, tc.code, rec.Error.Code)
			require.Equal(t, state.StatusFailed, end.Status)
			require.Equal(t, "step", end.Error.Kind)
			require.Equal(t, tc.fatal, end.Error.Fatal)
			require.Equal(t, tc.code, end.Error.Code)
		})
	}
}

// The body sees a step's committed failure as a *StepError, the same on
// every replay, with the code of a coded error; a body that handles it
// goes on.
func TestCommittedFailureReplaysAsStepError(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var seen atomic.Value
	e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		_, err := seqStep(c, "a", func(context.Context) (json.RawMessage, error) { return nil, fatal{"nope"} })
		seen.Store(err)
		var se *StepError
		if !errors.As(err, &se) {
			return nil, errors.New("not a step error")
		}
		return seqStep(c, "compensate", ok(`"compensated"`))
	}, nil)
	r.serveCounted(e, 1, true, false)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `"compensated"`, string(end.Output))
	err, _ := seen.Load().(error)
	require.ErrorIs(t, err, ErrStepFailed)
	var coded *CodedError
	require.ErrorAs(t, err, &coded, "the code is not reachable with errors.As")
	require.Equal(t, "nope", coded.Code)
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "r.a.0", se.StepID)
	require.Equal(t, "nope", se.Code)
	require.True(t, se.Fatal)
	require.Equal(t, 1, se.Attempts)
}

// A failed sequential step whose backoff is over 2 s parks the run on a
// timer: the failure is logged with not_before (the next attempt's due
// time), a run timer carries the next attempt's number under the message
// ID <step-id>#<attempt>, and the run parks on the step. A wake before
// then (here a sweep's) parks again without starting the attempt early;
// the timer's wake runs it.
func TestLongBackoffParksOnATimer(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	var calls atomic.Int32
	e := r.executor("w1", oneStep(RetryPolicy{}, failing(&calls, retryIn(time.Hour))), hk.install)
	r.serveCounted(e, 1, true, false)
	failedAt := r.clock.Now()
	run := r.start("r", `{}`)
	require.Equal(t, []string{"r.a.0"}, await(r, hk.parks, "the park on the retry"))

	log := r.attempts("r.a.0")
	require.NotNil(t, log)
	require.Equal(t, 1, log.Started)
	require.Equal(t, failedAt.Add(time.Hour).UTC(), log.NotBefore)
	require.Len(t, log.Failures, 1)
	timer := r.timers()["r.a.0"]
	require.True(t, timer.Wake)
	require.Equal(t, 2, timer.Attempt)
	sched := r.tap.published("jetflow.sched.")
	require.Len(t, sched, 1)
	require.Equal(t, "r.a.0#2", sched[0].Header.Get(jetstream.TaskIDHeader))
	l, _ := r.lease("r")
	require.Equal(t, state.LeaseParked, l.State)
	require.Nil(t, r.step("r.a.0"))

	// A sweep's wake before the timer is due starts nothing.
	_, rev := r.runRecord("r")
	r.wake(run, rev, "", "r.sweep.1")
	require.Equal(t, []string{"r.a.0"}, await(r, hk.parks, "the sweep's park"))
	require.Equal(t, []int{1}, hk.attempts.of("r.a.0"), "an attempt started before its backoff passed")
	// The holder stores the timer (and has it acknowledged) before it
	// parks, and the tap sees every publish made before it is asked.
	require.Len(t, r.tap.published("jetflow.sched."), 2, "the sweep's holder did not store the retry's timer again")
	require.Len(t, r.timers(), 1, "the timer stored again is not the same timer")

	r.serveTimers()
	require.Equal(t, 1, r.fireDue(time.Hour))
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.Equal(t, []int{1, 2}, hk.attempts.of("r.a.0"))
	rec := r.step("r.a.0")
	require.Equal(t, 2, rec.Attempt)
	require.Len(t, rec.Failures, 1)
	log = r.attempts("r.a.0")
	require.Equal(t, 2, log.Started)
	require.True(t, log.NotBefore.IsZero(), "the attempt that ran left not_before")
}

// A holder that takes a run over numbers the step it reaches from the
// step's attempt log, since the holder before may have started it: with
// no log, attempt 2; with a log, the next after the highest started; and
// an attempt beyond MaxAttempts (a crash loop) fails the step without
// running it.
func TestAttemptsOfATakenOverRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		started int // the attempt log's count (0: no log)
		max     int
		attempt int
		runs    bool
	}{
		{"no log: the holder before counts", 0, 5, 2, true},
		{"a log: the next after the highest started", 3, 5, 4, true},
		{"past MaxAttempts: failed without running", 3, 3, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			hk := newHooked()
			var calls atomic.Int32
			e := r.executor("w1", oneStep(RetryPolicy{MaxAttempts: tc.max}, failing(&calls)), hk.install)
			if tc.started > 0 {
				r.putAttempts("r.a.0", state.AttemptLog{Started: tc.started})
			}
			// A wake of a run whose lease nobody parked: the holder
			// inherits it.
			run, rev := r.createRun("r", nil)
			r.wake(run, rev, "", "r.sweep.1")
			r.serveCounted(e, 1, true, false)
			end := r.wait("r")
			require.Equal(t, []int{tc.attempt}, hk.attempts.of("r.a.0"))
			require.Equal(t, tc.runs, calls.Load() == 1, "the step function ran %d times", calls.Load())
			rec := r.step("r.a.0")
			require.Equal(t, tc.attempt, rec.Attempt)
			require.Equal(t, tc.attempt, r.attempts("r.a.0").Started, "the attempt was not recorded before it ran")
			if tc.runs {
				require.Equal(t, state.StatusCompleted, end.Status)
				require.Nil(t, rec.Error)
				return
			}
			require.Equal(t, state.StatusFailed, end.Status)
			require.Contains(t, rec.Error.Message, "is more than MaxAttempts")
			require.False(t, rec.Error.Fatal)
		})
	}
}

// A failed branch with a short backoff waits as a delayed nak: its task is
// delivered again and runs the next attempt, counted in the step's
// attempt log; no timer is stored.
func TestBranchShortBackoffNaks(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	var calls atomic.Int32
	e := r.executor("w1", fanOut(failing(&calls, retryIn(5*time.Millisecond)), ok(`"y"`)), hk.install)
	s := r.serveCounted(e, 2, true, true)
	r.start("r", `{}`)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.Equal(t, []int{1, 2}, hk.attempts.of("r.x.0"))
	require.Equal(t, []int{1, 2}, s.branches.of(jetstream.BranchSubject(wf, "r.x.0")), "the retry is not the task's redelivery")
	require.Empty(t, r.tap.published("jetflow.sched."))
	rec := r.step("r.x.0")
	require.Equal(t, 2, rec.Attempt)
	require.Len(t, rec.Failures, 1)
	require.Equal(t, 2, r.attempts("r.x.0").Started)
}

// A failed branch with a backoff of 2 s or more stores its retry as a
// branch timer carrying the next attempt (message ID <step-id>#<attempt>)
// and acknowledges its task: nothing of it waits ack-pending. The timer's
// task runs the next attempt.
func TestBranchLongBackoffStoresATimer(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	var calls atomic.Int32
	e := r.executor("w1", fanOut(failing(&calls, retryIn(time.Hour)), ok(`"y"`)), hk.install)
	s := r.serveCounted(e, 2, true, true)
	r.start("r", `{}`)
	r.eventually(func() bool { return len(r.timers()) == 1 }, "no branch timer stored")
	timer := r.timers()["r.x.0"]
	require.Equal(t, 2, timer.Attempt)
	require.False(t, timer.Wake, "a branch's retry is its task, not a wake of the run")
	require.False(t, timer.Redispatched)
	sched := r.tap.published("jetflow.sched.")
	require.NotEmpty(t, sched, "the tap saw no timer publish")
	require.Equal(t, "r.x.0#2", sched[0].Header.Get(jetstream.TaskIDHeader))
	r.eventually(func() bool { _, _, ok := r.pending(jetstream.BranchSubject(wf, "r.x.0")); return !ok },
		"the failed branch task is still stored")
	log := r.attempts("r.x.0")
	require.Equal(t, 1, log.Started)
	require.Len(t, log.Failures, 1)

	r.serveTimers()
	require.Equal(t, 1, r.fireDue(time.Hour))
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.Equal(t, []int{1, 2}, hk.attempts.of("r.x.0"))
	require.Equal(t, []int{1, 1}, s.branches.of(jetstream.BranchSubject(wf, "r.x.0")), "the retry came as a redelivery, not a new task")
	require.Equal(t, 2, r.step("r.x.0").Attempt)
}

// A branch task redelivered (its first delivery's worker died mid-step,
// leaving no log) counts the first delivery as an attempt; a redispatched
// task whose retry waits as a timer is not the step's to run.
func TestBranchAttemptNumbering(t *testing.T) {
	t.Parallel()
	t.Run("redelivery without a log is attempt 2", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, time.Second)
		hk := newHooked()
		e := r.executor("w1", fanOut(ok(`"x"`), ok(`"y"`)), hk.install)
		r.serveCounted(e, 1, true, false)
		r.start("r", `{}`)
		await(r, hk.parks, "the park")
		// The first delivery of x's task dies: handed back without a
		// record, as a crash would leave it.
		var first atomic.Bool
		branches := e.Branches()
		r.serveHandlers(2, false, nil, probe(func(ctx context.Context, m *consume.Delivery) {
			if m.Msg.Subject() == jetstream.BranchSubject(wf, "r.x.0") && !first.Swap(true) {
				_ = m.Msg.Nak()
				return
			}
			branches.Handle(ctx, m)
		}))
		end := r.wait("r")
		require.Equal(t, state.StatusCompleted, end.Status)
		require.Equal(t, []int{2}, hk.attempts.of("r.x.0"))
		require.Equal(t, []int{1}, hk.attempts.of("r.y.0"))
		require.Equal(t, 2, r.step("r.x.0").Attempt)
	})
	t.Run("redispatched while a retry timer waits: dropped", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, time.Second)
		hk := newHooked()
		var calls atomic.Int32
		e := r.executor("w1", fanOut(failing(&calls, retryIn(time.Hour)), ok(`"y"`)), hk.install)
		s := r.serveCounted(e, 2, true, true)
		run := r.start("r", `{}`)
		r.eventually(func() bool { return len(r.timers()) == 1 }, "no branch timer stored")
		r.eventually(func() bool { _, _, ok := r.pending(jetstream.BranchSubject(wf, "r.x.0")); return !ok }, "x's task still stored")
		// x's task published again by a holder that began the await
		// again, after the broker's duplicate window (within it, the
		// repeat is absorbed by its message ID).
		_, rev := r.runRecord("r")
		task := state.StepTask(run, rev, "r.x.0")
		task.Redispatched = true
		r.publish(jetstream.BranchSubject(wf, "r.x.0"), "r.x.0.again", task)
		r.eventually(func() bool { return len(s.branches.of(jetstream.BranchSubject(wf, "r.x.0"))) == 2 }, "x's task was not delivered again")
		r.eventually(func() bool { _, _, ok := r.pending(jetstream.BranchSubject(wf, "r.x.0")); return !ok }, "the redispatched task was not dropped")
		require.Equal(t, []int{1}, hk.attempts.of("r.x.0"), "the redispatched task ran the attempt its timer owns")
		require.Nil(t, r.step("r.x.0"))
		require.Len(t, r.timers(), 1)
	})
}
