package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// stepCall is one call of a step the body started.
type stepCall struct {
	name    string
	id      string
	seq     int
	policy  RetryPolicy // with defaults
	taskKey TaskKey
	fn      StepFunc
	// child is set for a child step (StartChild): beginning it starts the
	// child run.
	child *ChildSpec
	// wait is set for a wait (StartWait): beginning it stores what ends
	// the wait, or commits its end.
	wait *WaitSpec
}

// stepAttempt is one attempt at a step call.
type stepAttempt struct {
	*stepCall
	attempt int
	key     *keyCall // nil: no task key
	start   time.Time
	// failures are earlier attempts of this delivery that failed and were
	// retried in place, for the record (the attempt log has them too).
	failures []state.AttemptFailure
	// mayCall, when set, is asked right before the step function is
	// called (after the task key is acquired, which may wait): an error
	// says the caller may no longer run the step (a holder's lease lost
	// while the process was stopped) and is the attempt's settlement
	// (lostOr).
	mayCall func() error
}

// commitFunc writes the encoded record of step id: under the holder's
// lease (inline steps), or with create-if-absent (branches). It returns
// the record's revision.
type commitFunc func(id string, b []byte) (uint64, error)

// runAttempt runs attempt a of a step of d's run and commits its result
// with commit. It returns the committed record, or, when the attempt
// commits nothing, how to settle instead: a retry (the step failed and
// may run again), a release, a drop (the run was cancelled) or a lost
// lease. A branch whose step another attempt committed first gets that
// attempt's record.
func (e *Executor) runAttempt(d *delivery, a *stepAttempt, commit commitFunc) (rec *state.Step, s *settlement) {
	sc := a.stepCall
	if h := e.cfg.Hooks.BeforeAttempt; h != nil {
		h(sc.id, a.attempt)
	}
	span := e.startStepSpan(d, a)
	defer func() { endStepSpan(span, a, rec, s) }()
	// Its series exist at 0 from here: its first failure is an increase.
	e.cfg.Metrics.StepBegins(d.run.Workflow, sc.name)
	defer a.key.abandon(d.nctx) // a claim still held when this returns without a result (retry, release) is released
	rec, result, s := e.outcome(d, a)
	if s != nil {
		return nil, s
	}
	return e.record(d, a, rec, result, commit)
}

// outcome produces the result of attempt a: the result stored under its
// task key, a failure when the attempt is beyond the budget, or what the
// step function returns. It returns a settlement instead when the step is
// to be retried, the worker is stopping, the run was cancelled or the key
// cannot be acquired.
func (e *Executor) outcome(d *delivery, a *stepAttempt) (*state.Step, metrics.StepResult, *settlement) {
	sc, attempt, key := a.stepCall, a.attempt, a.key
	info := jetflowtype.StepDetails{StepID: sc.id, StepName: sc.name, Attempt: attempt, RunID: d.run.RunID, Workflow: d.run.Workflow}
	rec := &state.Step{V: state.Version, StepID: sc.id, RunID: d.run.RunID, Name: sc.name, Seq: sc.seq, Attempt: attempt, Worker: e.cfg.WorkerID, Build: e.cfg.Build, StartedAt: a.start.UTC()}
	cached, err := key.acquire(d.ctx, d.nctx)
	if err != nil {
		return rec, "", stopped(d, err)
	}
	if cached != nil {
		rec.Output, rec.Error, rec.Attempt, rec.Worker = cached.Output, cached.Error, cached.Attempt, key.worker(rec.Worker)
		return rec, metrics.StepCommitted, nil
	}
	if attempt > sc.policy.MaxAttempts {
		// Attempts beyond the budget (crash loops): fail without running.
		// This is jetflow's dead letter: the step was started more often
		// than it may run.
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("attempt %d is more than MaxAttempts %d", attempt, sc.policy.MaxAttempts), Kind: "step"}
		e.cfg.Metrics.MaxDeliveries(d.run.Workflow)
		d.stepEvent(d.log.Warn(), sc.id).Int("attempt", attempt).Msg("step started more often than MaxAttempts; failing it")
		return rec, metrics.StepFailed, nil
	}
	if a.mayCall != nil {
		if err := a.mayCall(); err != nil {
			return rec, "", lostOr(err)
		}
	}
	out, err := e.call(d.ctx, info, sc.fn)
	switch {
	case err == nil && len(out) > state.MaxInputBytes:
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("step output of %d bytes is over the %d-byte limit", len(out), state.MaxInputBytes), Fatal: true, Kind: "step"}
		return rec, metrics.StepFatal, nil
	case err == nil:
		rec.Output = out
		return rec, metrics.StepCommitted, nil
	case d.ctx.Err() != nil:
		// The run was cancelled, the lease lost or the worker is stopping
		// while the step ran: this attempt did not finish.
		return rec, "", stopped(d, err)
	case isFatal(err):
		rec.Error = &state.ErrorInfo{Message: err.Error(), Fatal: true, Kind: "step", Code: errorCode(err)}
		return rec, metrics.StepFatal, nil
	case attempt < sc.policy.MaxAttempts:
		delay, ok := retryAfter(err)
		if !ok {
			delay = Backoff(sc.policy, attempt)
		}
		d.stepEvent(d.log.Info(), sc.id).Int("attempt", attempt).
			Str("retry_in", logging.Duration(delay)).Err(err).Msg("step failed; retrying")
		e.observeStep(d.run.Workflow, sc.name, metrics.StepRetried, a.start)
		return rec, "", &settlement{kind: settleRetry, delay: delay, attempt: attempt, err: err, started: a.start, stepID: sc.id}
	default:
		rec.Error = &state.ErrorInfo{Message: err.Error(), Kind: "step", Code: errorCode(err)}
		return rec, metrics.StepFailed, nil
	}
}

// stopped is the settlement of an attempt cut short by d's context (or an
// error while it was cut): a drop when the run was cancelled, lost when
// its lease was, else a release.
func stopped(d *delivery, err error) *settlement {
	switch cause := context.Cause(d.ctx); {
	case errors.Is(cause, ErrRunCancelled):
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: %w", errRunNotRunning, err)}
	case errors.Is(cause, errLeaseLost):
		return &settlement{kind: settleLost, err: cause}
	}
	return &settlement{kind: settleRelease, err: err}
}

// record commits rec, the result of attempt a, after writing it to the
// step's task key. It returns the committed record (another attempt's when
// that one committed first), or how to settle when the commit cannot be
// made (a release) or was refused to a holder that lost its lease.
func (e *Executor) record(d *delivery, a *stepAttempt, rec *state.Step, result metrics.StepResult, commit commitFunc) (*state.Step, *settlement) {
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
	key.finish(d.nctx, *rec) // the key's result first: a crash before the commit leaves it to this step's next attempt
	won := true
	rev, err := commit(sc.id, b)
	rec.Rev = rev
	switch {
	case errors.Is(err, jetstream.ErrExists):
		stored, err := e.committed(d.nctx, sc.id)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		if stored.Worker != rec.Worker || stored.Attempt != rec.Attempt || !stored.Committed.Equal(rec.Committed) {
			// Another attempt committed first; its result is the result.
			d.stepEvent(d.log.Info(), sc.id).Int("attempt", a.attempt).Msg("step was committed by another attempt; keeping its result")
			won = false
		}
		rec = stored
	case err != nil:
		if h := e.cfg.Hooks.AfterCommit; h != nil {
			h(sc.id, false)
		}
		return nil, lostOr(err)
	}
	if won { // the winner counts the step's result, once
		e.observeStep(d.run.Workflow, sc.name, result, a.start)
		if key.served() {
			e.cfg.Metrics.Suppressed(metrics.LayerTaskKey)
		}
	}
	if h := e.cfg.Hooks.AfterCommit; h != nil {
		h(sc.id, won)
	}
	return rec, nil
}

// committed reads the record of step id, which a write has just found
// there, with its revision.
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

// commitAttempts bounds the retries of a step commit that got no answer.
const commitAttempts = 3

// create writes a step record with create-if-absent (a branch's commit,
// the end of a wait, a child's result). A write that got no answer (a
// timeout, a lost connection) is retried in place rather than releasing
// the task, which would run the step's side effect again; if the first
// write had landed, the retry sees ErrExists and the caller finds its own
// record.
func (e *Executor) create(ctx context.Context, id string, b []byte) (rev uint64, err error) {
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

// createOver is create for d's run, except over a waived record
// (state.Run.WaivedRev): the commit replaces that record, by
// compare-and-set on its revision, as if it were not there. A record
// written meanwhile is ErrExists, as for create.
func (e *Executor) createOver(d *delivery, id string, b []byte) (uint64, error) {
	rev := d.run.WaivedRev[id]
	if rev == 0 || !slices.Contains(d.run.Waived, id) {
		return e.create(d.nctx, id, b)
	}
	n, err := e.cfg.Assets.Steps.Update(d.nctx, id, b, rev)
	if errors.Is(err, jetstream.ErrRevisionMismatch) {
		return 0, jetstream.ErrExists
	}
	return n, err
}

// commitRecord commits rec with create-if-absent, running nothing (a
// wait's end, a child's result), and returns the committed record:
// another writer's when it came first.
func (e *Executor) commitRecord(d *delivery, rec *state.Step) (*state.Step, *settlement) {
	rec.Committed, rec.Build = e.cfg.Now().UTC(), e.cfg.Build
	b, err := state.Encode(*rec)
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	rev, err := e.createOver(d, rec.StepID, b)
	if errors.Is(err, jetstream.ErrExists) {
		stored, err := e.committed(d.nctx, rec.StepID)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		return stored, nil
	}
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	rec.Rev = rev
	return rec, nil
}

// call runs fn with the step's info in its context, turning a panic into an
// error.
func (e *Executor) call(ctx context.Context, info jetflowtype.StepDetails, fn StepFunc) (out json.RawMessage, err error) {
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

// attemptFailures are the failed attempts of the step of attempt a before
// it, for its record: the ones this delivery retried in place, else those
// of the step's attempt log (read only when a is not the first). A log
// that cannot be read leaves them out (with a warning): the result is
// committed either way.
func (e *Executor) attemptFailures(d *delivery, a *stepAttempt) []state.AttemptFailure {
	if a.attempt <= 1 {
		return nil
	}
	v, _, err := e.cfg.Assets.Attempts.Get(d.nctx, a.id)
	var l state.AttemptLog
	if err == nil {
		l, err = state.DecodeAttemptLog(v)
	}
	if errors.Is(err, jetstream.ErrNotFound) {
		return a.failures
	}
	if err != nil {
		d.stepEvent(d.log.Warn().Err(err), a.id).Msg("cannot read the step's earlier attempts; its record leaves them out")
		return a.failures
	}
	var out []state.AttemptFailure
	for _, f := range l.Failures {
		if f.Attempt < a.attempt && (f.StepID == "" || f.StepID == a.id) {
			out = append(out, f)
		}
	}
	return out
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

// failure is the attempt log's entry of the failed attempt s retries.
func (e *Executor) failure(s *settlement) state.AttemptFailure {
	f := state.AttemptFailure{StepID: s.stepID, Attempt: s.attempt, StartedAt: s.started.UTC(), EndedAt: e.cfg.Now().UTC(), Worker: e.cfg.WorkerID}
	if s.err != nil {
		f.Error = s.err.Error()
	}
	return f
}

// recordFailure logs the failed attempt s retries in the step's attempt
// log, which also raises the log's started count to next (s's attempt, or
// the one after it when the holder starts that one at once), and when
// notBefore is set records that the next attempt must not start before
// it: a holder that takes the run over meanwhile parks instead of running
// it early.
func (e *Executor) recordFailure(ctx context.Context, s *settlement, next int, notBefore time.Time) error {
	f := e.failure(s)
	return e.editAttemptLog(ctx, s.stepID, func(l *state.AttemptLog, _ bool) (bool, error) {
		l.Add(f)
		l.Started = max(l.Started, next)
		l.NotBefore = notBefore.UTC()
		return true, nil
	})
}
