package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
)

// stepCall is one call of a step that a task is to execute.
type stepCall struct {
	name    string
	id      string
	seq     int
	policy  RetryPolicy // with defaults
	taskKey TaskKey
	fn      StepFunc
	// child is set for a child step (StartChild): executing it starts the
	// child run.
	child *ChildSpec
	// wait is set for a wait (StartWait): executing it stores what ends
	// the wait, or commits its end.
	wait *WaitSpec
	// recheck: a start task published other steps before this one ran,
	// so the run's record is read again before it starts.
	recheck bool
	// checked, when set, brings the answer of that read, started when the
	// step was looked up (a step task's own step).
	checked <-chan *settlement
}

// stepAttempt is one attempt at a step call.
type stepAttempt struct {
	*stepCall
	attempt int
	key     *keyCall // nil: no task key
	start   time.Time
}

// execute runs the step this task owns and commits its result. It returns
// the committed record, which is the one another worker committed first if
// this one lost the race; or, when this attempt commits nothing, how to
// settle the task instead (a retry, a release, a drop). found is set when
// the step turned out committed before its function ran: the task ran
// nothing, as if its lookup had found the record.
func (e *Executor) execute(d *delivery, sc *stepCall) (rec *state.Step, s *settlement, found bool) {
	key, err := e.keyCall(d, sc)
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}, false
	}
	attempt, err := e.beginAttempt(d)
	if errors.Is(err, errNotThisTask) {
		return nil, &settlement{kind: settleDrop, err: err}, false
	}
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}, false
	}
	if s := e.ranCheck(d, sc); s != nil {
		return nil, s, false
	}
	if h := e.cfg.Hooks.BeforeAttempt; h != nil {
		h(sc.id, attempt)
	}
	if attempt > 1 {
		// A redelivery can come while the attempt before it still runs
		// (its worker stalled past the AckWait) and commits after this
		// task's lookup: read the record again just before the function
		// runs, so that such a commit is the result, not a second run.
		stored, err := e.lookup(d.nctx, d.runKey(), sc.id)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}, false
		}
		if stored != nil {
			d.log.Info().Str("step_id", sc.id).Int("attempt", attempt).
				Msg("step was committed by an earlier attempt after this task looked it up; keeping its result")
			return stored, nil, true
		}
	}
	a := &stepAttempt{stepCall: sc, attempt: attempt, key: key, start: e.cfg.Now()}
	span := e.startStepSpan(d, a)
	defer func() { endStepSpan(span, a, rec, s) }()
	// Its series exist at 0 from here: its first failure is an increase.
	e.cfg.Metrics.StepBegins(d.run.Workflow, sc.name)
	defer key.abandon(d.nctx) // a claim still held when this returns without a result (retry, release) is released
	rec, result, s := e.outcome(d, a)
	if s != nil {
		return nil, s, false
	}
	rec, s = e.record(d, a, rec, result)
	return rec, s, false
}

// ranCheck is stillRunning's answer for sc: the one started beside its
// lookup, or a read now.
func (e *Executor) ranCheck(d *delivery, sc *stepCall) *settlement {
	if sc.checked == nil {
		return e.stillRunning(d, sc.recheck)
	}
	if s := <-sc.checked; s != nil {
		return s
	}
	// A cancel notice that came while the read was out.
	if e.cancelled.has(d.run.RunID, d.run.Token) || cancelledRun(d) {
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: it is cancelled", errRunNotRunning)}
	}
	return nil
}

// outcome produces the result of attempt a: the result stored under its
// task key, a failure when the attempt is beyond the budget, or what the
// step function returns. It returns a settlement instead when the step is
// to be retried, the worker is stopping or the key cannot be acquired.
func (e *Executor) outcome(d *delivery, a *stepAttempt) (*state.Step, metrics.StepResult, *settlement) {
	sc, attempt, key := a.stepCall, a.attempt, a.key
	info := StepInfo{StepID: sc.id, StepName: sc.name, Attempt: attempt, RunID: d.run.RunID, Workflow: d.run.Workflow}
	rec := &state.Step{V: state.Version, StepID: sc.id, RunID: d.run.RunID, Name: sc.name, Seq: sc.seq, Attempt: attempt, Worker: e.cfg.WorkerID, StartedAt: a.start.UTC()}
	cached, err := key.acquire(d.ctx, d.nctx)
	if err != nil {
		return rec, "", &settlement{kind: settleRelease, err: err}
	}
	if cached != nil {
		rec.Output, rec.Error, rec.Attempt, rec.Worker = cached.Output, cached.Error, cached.Attempt, key.worker(rec.Worker)
		return rec, metrics.StepCommitted, nil
	}
	if attempt > sc.policy.MaxAttempts {
		// Attempts beyond the budget (crash loops): fail without running.
		// This is jetflow's dead letter: the task was delivered more often
		// than the step may run.
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("attempt %d is more than MaxAttempts %d", attempt, sc.policy.MaxAttempts), Kind: "step"}
		e.cfg.Metrics.MaxDeliveries(d.run.Workflow)
		d.log.Warn().Str("step_id", sc.id).Int("attempt", attempt).Msg("step delivered more often than MaxAttempts; failing it")
		return rec, metrics.StepFailed, nil
	}
	out, err := e.call(d.ctx, info, sc.fn)
	switch {
	case err == nil && len(out) > state.MaxInputBytes:
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("step output of %d bytes is over the %d-byte limit", len(out), state.MaxInputBytes), Fatal: true, Kind: "step"}
		return rec, metrics.StepFatal, nil
	case err == nil:
		rec.Output = out
		return rec, metrics.StepCommitted, nil
	case cancelledRun(d):
		// The run was cancelled while the step ran: nothing to commit.
		return rec, "", &settlement{kind: settleDrop, err: fmt.Errorf("%w: %w", errRunNotRunning, err)}
	case d.ctx.Err() != nil:
		// The worker is stopping: this attempt did not finish.
		return rec, "", &settlement{kind: settleRelease, err: err}
	case isFatal(err):
		rec.Error = &state.ErrorInfo{Message: err.Error(), Fatal: true, Kind: "step", Code: errorCode(err)}
		return rec, metrics.StepFatal, nil
	case attempt < sc.policy.MaxAttempts:
		delay, ok := retryAfter(err)
		if !ok {
			delay = sc.policy.Backoff(attempt)
		}
		d.log.Info().Str("step_id", sc.id).Int("attempt", attempt).
			Str("retry_in", logging.Duration(delay)).Err(err).Msg("step failed; retrying")
		e.observeStep(d.run.Workflow, sc.name, metrics.StepRetried, a.start)
		return rec, "", &settlement{kind: settleRetry, delay: delay, attempt: attempt, err: err, started: a.start, stepID: sc.id}
	default:
		rec.Error = &state.ErrorInfo{Message: err.Error(), Kind: "step", Code: errorCode(err)}
		return rec, metrics.StepFailed, nil
	}
}

// record commits rec, the result of attempt a, after writing it to the
// step's task key. It returns the committed record (another worker's when
// that one committed first), or a release settlement when the commit
// cannot be made or read back.
func (e *Executor) record(d *delivery, a *stepAttempt, rec *state.Step, result metrics.StepResult) (*state.Step, *settlement) {
	sc, key := a.stepCall, a.key
	rec.Committed = e.cfg.Now().UTC()
	rec.Failures = e.attemptFailures(d, a)
	b, err := key.encode(*rec)
	if errors.Is(err, state.ErrInputTooLarge) {
		// Retrying cannot make it fit: commit the failure instead.
		rec.Output = nil
		rec.Error = &state.ErrorInfo{Message: "step result too large to store: " + err.Error(), Fatal: true, Kind: "step"}
		result = metrics.StepFatal
		b, err = key.encode(*rec)
	}
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	key.finish(d.nctx, *rec) // the key's result first: a crash before the commit leaves it to this step's redelivery
	won := true
	rev, err := e.commit(d.nctx, sc.id, b)
	rec.Rev = rev
	if err != nil {
		if !errors.Is(err, jetstream.ErrExists) {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		stored, err := e.committed(d.nctx, sc.id)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		if stored.Worker != rec.Worker || stored.Attempt != rec.Attempt || !stored.Committed.Equal(rec.Committed) {
			// Another attempt committed first; its result is the result.
			d.log.Info().Str("step_id", sc.id).Int("attempt", a.attempt).Msg("step was committed by another worker; keeping its result")
			won = false
		}
		rec = stored
	}
	if won { // the winner counts the step's result, once
		e.observeStep(d.run.Workflow, sc.name, result, a.start)
		if key.served() {
			e.cfg.Metrics.Suppressed(metrics.LayerTaskKey)
		}
	}
	e.cache.put(d.runKey(), rec)
	if h := e.cfg.Hooks.AfterCommit; h != nil {
		h(sc.id, won)
	}
	return rec, nil
}

// committed reads the record of step id, which a create-if-absent has just
// reported as written, with its revision.
func (e *Executor) committed(ctx context.Context, id string) (*state.Step, error) {
	v, rev, err := e.cfg.Assets.Steps.GetExisting(ctx, id)
	if err != nil {
		return nil, err
	}
	stored, err := state.DecodeStep(v)
	if err != nil {
		return nil, err
	}
	stored.Rev = rev
	return &stored, nil
}

// attemptKey names the attempt record of the step a task runs: the step ID
// for a step task, <run-id>.start for the start task (which runs the run's
// first step).
func attemptKey(t state.Task) string {
	if t.StepID != "" {
		return t.StepID
	}
	return state.RunIdentity(t.RunID, t.Generation) + ".start"
}

// firstAttempt is the attempt the first delivery of t runs: 1, or the
// attempt a retry timer was stored for.
func firstAttempt(t state.Task) int { return max(1, t.Attempt) }

// beginAttempt returns the number of the attempt about to run the task's
// step, and makes sure no other delivery gets the same number. The step's
// attempt record holds the highest attempt started.
//
//   - The first delivery of a task message at attempt 1 costs nothing: it
//     is attempt 1.
//   - A redelivery reads and advances the record with compare-and-set
//     before the step runs. Finding no record, it counts the first delivery
//     as having run (it may have crashed mid-step), unless that delivery
//     was handed back unstarted (Release writes the record).
//   - The first delivery of a retry (a message stored for attempt n > 1)
//     records n, so that its own redelivery is n+1; if attempt n already
//     started (its failed task was redelivered after a crash), the retry
//     is not this task's to run (errNotThisTask).
//   - A redispatched task (Task.Redispatched, or a duplicate's start task)
//     first checks that no retry timer of the step is waiting — the timer
//     owns the next attempt, errNotThisTask — and counts on from the
//     record.
//
// Attempts are thus counted per start of the step, not per delivery: a
// delivery that never ran the step does not use up MaxAttempts.
func (e *Executor) beginAttempt(d *delivery) (int, error) {
	first := firstAttempt(d.task)
	stray := d.task.Redispatched || (d.task.StepID == "" && d.task.Token != d.run.Token)
	if d.delivered <= 1 && first == 1 && !stray {
		return 1, nil
	}
	if stray && d.delivered <= 1 {
		// Published while no task of the step was pending: the step may
		// be waiting for a retry timer, which owns its next attempt.
		waiting, err := jetstream.HasTimer(d.nctx, e.cfg.Assets.Timers, d.taskSubject(), false)
		if err != nil {
			return 0, err
		}
		if waiting {
			return 0, fmt.Errorf("%w: a retry of the step waits as a timer", errNotThisTask)
		}
	}
	var attempt int
	err := e.editAttemptLog(d.nctx, attemptKey(d.task), func(l *state.AttemptLog, found bool) (bool, error) {
		switch {
		case !found && d.delivered > 1 && first == 1:
			attempt = 2 // the first delivery ran attempt 1 without a record
		case !found:
			attempt = first
		case first > 1 && d.delivered <= 1 && l.Started >= first:
			// A retry timer's task whose attempt already ran (its failed
			// task was redelivered after a crash instead).
			return false, fmt.Errorf("%w: attempt %d already started", errNotThisTask, first)
		default:
			attempt = max(first, l.Started+1)
		}
		l.Started = attempt // a concurrent delivery that takes this number first makes this one read again
		return true, nil
	})
	return attempt, err
}

// editAttemptLog applies edit to the attempt log under key (found is false
// when there is none yet) and writes the result with compare-and-set,
// reading again and applying edit again when another writer came first.
// An edit that returns false writes nothing.
func (e *Executor) editAttemptLog(ctx context.Context, key string, edit func(l *state.AttemptLog, found bool) (bool, error)) error {
	for {
		v, rev, err := e.cfg.Assets.Attempts.Get(ctx, key)
		l := state.AttemptLog{V: state.Version}
		switch {
		case errors.Is(err, jetstream.ErrNotFound):
		case err != nil:
			return err
		default:
			if l, err = state.DecodeAttemptLog(v); err != nil {
				return fmt.Errorf("attempt record %s: %w", key, err)
			}
		}
		write, err := edit(&l, rev != 0)
		if err != nil || !write {
			return err
		}
		b, err := state.Encode(l)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = e.cfg.Assets.Attempts.Create(ctx, key, b)
		} else {
			_, err = e.cfg.Assets.Attempts.Update(ctx, key, b, rev)
		}
		if !errors.Is(err, jetstream.ErrExists) && !errors.Is(err, jetstream.ErrRevisionMismatch) {
			return err
		}
	}
}

// attemptFailures are the failed attempts of the step of attempt a
// logged before it, for its record: read only when a is not the first.
// A log that cannot be read leaves them out (with a warning): the result
// is committed either way.
func (e *Executor) attemptFailures(d *delivery, a *stepAttempt) []state.AttemptFailure {
	if a.attempt <= 1 {
		return nil
	}
	v, _, err := e.cfg.Assets.Attempts.Get(d.nctx, attemptKey(d.task))
	var l state.AttemptLog
	if err == nil {
		l, err = state.DecodeAttemptLog(v)
	}
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil
	}
	if err != nil {
		d.log.Warn().Err(err).Str("step_id", a.id).Msg("cannot read the step's earlier attempts; its record leaves them out")
		return nil
	}
	var out []state.AttemptFailure
	for _, f := range l.Failures {
		if f.Attempt < a.attempt && (f.StepID == "" || f.StepID == a.id) {
			out = append(out, f)
		}
	}
	return out
}

// commitAttempts bounds the retries of a step commit that got no answer.
const commitAttempts = 3

// commit writes a step record with create-if-absent. A write that got no
// answer (a timeout, a lost connection) is retried in place rather than
// releasing the task, which would run the step's side effect again; if the
// first write had landed, the retry sees ErrExists and the caller finds
// its own record.
func (e *Executor) commit(ctx context.Context, id string, b []byte) (rev uint64, err error) {
	for attempt := 1; attempt <= commitAttempts; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rev, err = e.cfg.Assets.Steps.Create(actx, id, b)
		cancel()
		if err == nil || jetstream.IsAPIError(err) || errors.Is(err, jetstream.ErrExists) {
			return rev, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	return 0, err
}

// call runs fn with the step's info in its context, turning a panic into an
// error.
func (e *Executor) call(ctx context.Context, info StepInfo, fn StepFunc) (out json.RawMessage, err error) {
	ctx = context.WithValue(ctx, stepInfoKey{}, info)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("step panicked: %v", r)
		}
	}()
	out, err = fn(ctx)
	if err == nil && !json.Valid(out) {
		err = fmt.Errorf("step returned invalid JSON")
	}
	return out, err
}

func (e *Executor) observeStep(wf, step string, result metrics.StepResult, start time.Time) {
	e.cfg.Metrics.Step(wf, step, result, e.cfg.Now().Sub(start))
}
