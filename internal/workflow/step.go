package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
)

// execute runs the step this task owns and commits its result, or suspends
// for a retry or a release. It returns the committed record, which is the
// one another worker committed first if this one lost the race.
func (e *Executor) execute(c *Context, name, id string, seq int, policy RetryPolicy, fn StepFunc, key *keyCall) state.Step {
	attempt, err := e.beginAttempt(c)
	if errors.Is(err, errNotThisTask) {
		c.suspend(&settlement{kind: settleDrop, err: err})
	}
	if err != nil {
		c.suspend(&settlement{kind: settleRelease, err: err})
	}
	info := StepInfo{StepID: id, StepName: name, Attempt: attempt, RunID: c.run.RunID, Workflow: c.run.Workflow}
	rec := state.Step{V: state.Version, StepID: id, RunID: c.run.RunID, Name: name, Seq: seq, Attempt: attempt, Worker: e.cfg.WorkerID}
	start := e.cfg.Now()
	result := metrics.StepCommitted
	defer key.abandon(c) // a claim still held when this unwinds (retry, release) is released
	if cached := key.acquire(c); cached != nil {
		rec.Output, rec.Error, rec.Attempt, rec.Worker = cached.Output, cached.Error, cached.Attempt, key.worker(rec.Worker)
	} else if attempt > policy.MaxAttempts {
		// Attempts beyond the budget (crash loops): fail without running.
		// This is jetflow's dead letter: the task was delivered more often
		// than the step may run.
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("attempt %d is more than MaxAttempts %d", attempt, policy.MaxAttempts), Kind: "step"}
		result = metrics.StepFailed
		e.cfg.Metrics.MaxDeliveries(c.run.Workflow)
		e.log.Warn().Str("run_id", info.RunID).Str("step_id", id).Int("attempt", attempt).Msg("step delivered more often than MaxAttempts; failing it")
	} else {
		out, err := e.call(c, info, fn)
		switch {
		case err == nil && len(out) > state.MaxInputBytes:
			rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("step output of %d bytes is over the %d-byte limit", len(out), state.MaxInputBytes), Fatal: true, Kind: "step"}
			result = metrics.StepFatal
		case err == nil:
			rec.Output = out
		case c.ctx.Err() != nil:
			// The worker is stopping: this attempt did not finish.
			c.suspend(&settlement{kind: settleRelease, err: err})
		case isFatal(err):
			rec.Error = &state.ErrorInfo{Message: err.Error(), Fatal: true, Kind: "step", Code: errorCode(err)}
			result = metrics.StepFatal
		case attempt < policy.MaxAttempts:
			delay, ok := retryAfter(err)
			if !ok {
				delay = policy.Backoff(attempt)
			}
			e.log.Info().Str("run_id", info.RunID).Str("step_id", id).Int("attempt", attempt).
				Dur("retry_in", delay).Err(err).Msg("step failed; retrying")
			e.observeStep(c.run.Workflow, name, metrics.StepRetried, start)
			c.suspend(&settlement{kind: settleRetry, delay: delay, attempt: attempt, err: err})
		default:
			rec.Error = &state.ErrorInfo{Message: err.Error(), Kind: "step", Code: errorCode(err)}
			result = metrics.StepFailed
		}
	}
	rec.Committed = e.cfg.Now().UTC()
	b, err := key.encode(rec)
	if errors.Is(err, state.ErrInputTooLarge) {
		// Retrying cannot make it fit: commit the failure instead.
		rec.Output = nil
		rec.Error = &state.ErrorInfo{Message: "step result too large to store: " + err.Error(), Fatal: true, Kind: "step"}
		result = metrics.StepFatal
		b, err = key.encode(rec)
	}
	if err != nil {
		c.suspend(&settlement{kind: settleRelease, err: err})
	}
	key.finish(c, rec) // the key's result first: a crash before the commit leaves it to this step's redelivery
	won := true
	if err := e.commit(c.nctx, id, b); err != nil {
		if !errors.Is(err, jetstream.ErrExists) {
			c.suspend(&settlement{kind: settleRelease, err: err})
		}
		v, _, gerr := e.cfg.Assets.Steps.GetExisting(c.nctx, id)
		if gerr != nil {
			c.suspend(&settlement{kind: settleRelease, err: gerr})
		}
		stored, err := state.DecodeStep(v)
		if err != nil {
			c.suspend(&settlement{kind: settleRelease, err: err})
		}
		if stored.Worker != rec.Worker || stored.Attempt != rec.Attempt || !stored.Committed.Equal(rec.Committed) {
			// Another attempt committed first; its result is the result.
			e.log.Info().Str("run_id", info.RunID).Str("step_id", id).Int("attempt", attempt).Msg("step was committed by another worker; keeping its result")
			won = false
		}
		rec = stored
	}
	if won { // the winner counts the step's result, once
		e.observeStep(c.run.Workflow, name, result, start)
		if key.served() {
			e.cfg.Metrics.Suppressed(metrics.LayerTaskKey)
		}
	}
	e.cache.put(c.runKey(), rec)
	if h := e.cfg.Hooks.AfterCommit; h != nil {
		h(id, won)
	}
	return rec
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
func (e *Executor) beginAttempt(c *Context) (int, error) {
	first := firstAttempt(c.task)
	stray := c.task.Redispatched || (c.task.StepID == "" && c.task.Token != c.run.Token)
	if c.delivered <= 1 && first == 1 && !stray {
		return 1, nil
	}
	if stray && c.delivered <= 1 {
		// Published while no task of the step was pending: the step may
		// be waiting for a retry timer, which owns its next attempt.
		waiting, err := jetstream.HasTimer(c.nctx, e.cfg.Assets.Timers, c.taskSubject())
		if err != nil {
			return 0, err
		}
		if waiting {
			return 0, fmt.Errorf("%w: a retry of the step waits as a timer", errNotThisTask)
		}
	}
	key := attemptKey(c.task)
	for {
		v, rev, err := e.cfg.Assets.Attempts.Get(c.nctx, key)
		var attempt int
		switch {
		case errors.Is(err, jetstream.ErrNotFound) && c.delivered > 1 && first == 1:
			attempt = 2 // the first delivery ran attempt 1 without a record
		case errors.Is(err, jetstream.ErrNotFound):
			attempt = first
		case err != nil:
			return 0, err
		default:
			started, err := strconv.Atoi(string(v))
			if err != nil {
				return 0, fmt.Errorf("%w: attempt record %s: %w", state.ErrCorrupt, key, err)
			}
			if first > 1 && c.delivered <= 1 && started >= first {
				// A retry timer's task whose attempt already ran (its
				// failed task was redelivered after a crash instead).
				return 0, fmt.Errorf("%w: attempt %d already started", errNotThisTask, first)
			}
			attempt = max(first, started+1)
		}
		b := []byte(strconv.Itoa(attempt))
		if rev == 0 {
			_, err = e.cfg.Assets.Attempts.Create(c.nctx, key, b)
		} else {
			_, err = e.cfg.Assets.Attempts.Update(c.nctx, key, b, rev)
		}
		if errors.Is(err, jetstream.ErrExists) || errors.Is(err, jetstream.ErrRevisionMismatch) {
			continue // a concurrent delivery took this number
		}
		return attempt, err
	}
}

// commitAttempts bounds the retries of a step commit that got no answer.
const commitAttempts = 3

// commit writes a step record with create-if-absent. A write that got no
// answer (a timeout, a lost connection) is retried in place rather than
// releasing the task, which would run the step's side effect again; if the
// first write had landed, the retry sees ErrExists and the caller finds
// its own record.
func (e *Executor) commit(ctx context.Context, id string, b []byte) error {
	var err error
	for attempt := 1; attempt <= commitAttempts; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = e.cfg.Assets.Steps.Create(actx, id, b)
		cancel()
		if err == nil || jetstream.IsAPIError(err) || errors.Is(err, jetstream.ErrExists) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	return err
}

// call runs fn with the step's info in its context, turning a panic into an
// error.
func (e *Executor) call(c *Context, info StepInfo, fn StepFunc) (out json.RawMessage, err error) {
	ctx := context.WithValue(c.ctx, stepInfoKey{}, info)
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
