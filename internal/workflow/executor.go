// Package workflow executes runs. A run advances one task at a time: the
// worker that receives a task replays the workflow body against the run's
// committed steps, runs the one step the task stands for, commits its result
// with create-if-absent, publishes the task of the next step and only then
// acknowledges its own. A committed step is never run again (its result is
// replayed), a step whose worker died before the commit runs again with the
// same step ID, and a late worker cannot overwrite a committed result.
package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// Definition is a registered workflow with its types erased.
type Definition struct {
	Name string
	// Run is the workflow body. It decodes input, calls c.Step for every
	// step and returns the JSON output. An input that cannot be decoded is
	// reported wrapped in ErrInput.
	Run func(c *Context, input json.RawMessage) (json.RawMessage, error)
}

// Hooks let tests inject faults at exact points. Nil hooks do nothing.
type Hooks struct {
	// AfterCommit runs after a step's commit was attempted and before the
	// next task is published and the current one acknowledged. won is false
	// when another worker had committed the step first.
	AfterCommit func(stepID string, won bool)
	// AfterRelease runs when a task fetched but never started was handed
	// back (Release), with its run ID.
	AfterRelease func(runID string)
	// NoHeartbeat (read by the Pool) stops tasks from extending their ack
	// deadline, as a paused or partitioned worker would fail to: the task
	// is redelivered while its step still runs (a zombie).
	NoHeartbeat bool
}

// Config configures an Executor.
type Config struct {
	Assets      *jetstream.Assets
	Admitter    *dedupe.Admitter
	Definitions map[string]Definition
	Logger      zerolog.Logger
	// WorkerID is written into step records for diagnosis.
	WorkerID string
	// ReleaseDelay is how long a released task waits before redelivery.
	ReleaseDelay time.Duration
	// CacheRuns bounds the history cache (runs).
	CacheRuns int
	Now       func() time.Time
	Hooks     Hooks
	// Metrics counts steps, runs and redeliveries (nil: none).
	Metrics *metrics.Metrics
}

// Executor handles task messages. It is safe for concurrent use.
type Executor struct {
	cfg       Config
	cache     *historyCache
	cancelled *cancelSet
	log       zerolog.Logger
}

// NewExecutor returns an executor.
func NewExecutor(cfg Config) *Executor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReleaseDelay == 0 {
		cfg.ReleaseDelay = time.Second
	}
	if cfg.CacheRuns == 0 {
		cfg.CacheRuns = 10000
	}
	return &Executor{cfg: cfg, cache: newHistoryCache(cfg.CacheRuns), cancelled: newCancelSet(cfg.CacheRuns), log: cfg.Logger}
}

// Handle processes one task message and settles it: acknowledged once the
// run has advanced durably, negatively acknowledged with a delay for a retry
// or a release, or terminated when the message can never be processed. It
// never returns an error: every failure is settled on the message and
// logged.
func (e *Executor) Handle(ctx context.Context, msg natsjs.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Msg("task without JetStream metadata; leaving it")
		return
	}
	e.cfg.Metrics.InFlight(1)
	defer e.cfg.Metrics.InFlight(-1)
	task, err := state.DecodeTask(msg.Data())
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Uint64("stream_seq", meta.Sequence.Stream).
			Msg("malformed task terminated")
		e.settleErr(msg.TermWithReason("malformed task: "+err.Error()), "term")
		return
	}
	lc := e.log.With().Str("run_id", task.RunID).Str("workflow", task.Workflow)
	if task.StepID != "" {
		lc = lc.Str("step_id", task.StepID)
	}
	log := lc.Uint64("delivered", meta.NumDelivered).Logger()
	if meta.NumDelivered > 1 {
		e.cfg.Metrics.Redelivered(task.Workflow)
	}
	def, ok := e.cfg.Definitions[task.Workflow]
	if !ok {
		log.Error().Msg("task for a workflow this worker does not serve; releasing it")
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	nctx := context.WithoutCancel(ctx)
	run, rev, err := e.loadRun(nctx, task)
	if errors.Is(err, dedupe.ErrStaleStart) {
		// A start answered by a run that has since expired (a duplicate's
		// task left in the stream, a task consumed after the retention):
		// it must never create a run.
		log.Warn().Err(err).Int("generation", task.Generation).Msg("stale start task dropped: its run expired; no run created")
		e.settleErr(msg.Ack(), "ack")
		return
	}
	if err != nil {
		log.Warn().Err(err).Msg("cannot load run; releasing task")
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	if run.Workflow != task.Workflow {
		// A start of another workflow under this run ID (after the broker's
		// window): the stored run wins and this task must not touch it.
		log.Error().Str("stored_workflow", run.Workflow).Msg("task for a run of another workflow dropped")
		e.settleErr(msg.Ack(), "ack")
		return
	}
	if run.Status.Terminal() || (task.StepID == "" && task.Generation != run.Generation) ||
		e.cancelled.has(run.RunID, run.Token) {
		// A stale task (duplicate start, late redelivery, a start task of a
		// generation that is not the run's): nothing to do. The current
		// generation always has a start task of its own.
		e.settleErr(msg.Ack(), "ack")
		return
	}
	c := &Context{
		ctx: ctx, nctx: nctx, exec: e, task: task, run: run, rev: rev,
		delivered: int(meta.NumDelivered), occ: make(map[string]int),
		done: make(chan *settlement, 1),
	}
	s := e.replay(c, def)
	e.settle(nctx, log, msg, c, s)
}

// MarkCancelled records that the run created with token was cancelled:
// its further tasks are dropped.
func (e *Executor) MarkCancelled(runID, token string) { e.cancelled.add(runID, token) }

// loadRun returns the run a task belongs to and the revision it was read
// at. A start task materialises the run record if its publisher died before
// writing it (dedupe.ErrStaleStart: the task must be dropped); a step task
// carries the record's fields.
func (e *Executor) loadRun(ctx context.Context, t state.Task) (state.Run, uint64, error) {
	if t.StepID == "" {
		return e.cfg.Admitter.Materialize(ctx, t)
	}
	return state.RunFromTask(t), t.Rev, nil
}

// replay runs the workflow body in its own goroutine until it returns or
// suspends at a step.
func (e *Executor) replay(c *Context, def Definition) *settlement {
	go func() {
		defer func() {
			if r := recover(); r != nil {
				c.done <- &settlement{kind: settleFinish, panic: true,
					err: fmt.Errorf("workflow panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := def.Run(c, c.run.Input)
		c.done <- &settlement{kind: settleFinish, output: out, err: err}
	}()
	return <-c.done
}

func (e *Executor) settle(ctx context.Context, log zerolog.Logger, msg natsjs.Msg, c *Context, s *settlement) {
	switch s.kind {
	case settleDispatch:
		if err := e.dispatch(ctx, c, s.stepID); err != nil {
			log.Warn().Err(err).Str("next_step_id", s.stepID).Msg("cannot publish next task; releasing")
			e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		e.settleErr(msg.Ack(), "ack")
	case settleRetry:
		e.retry(ctx, log, msg, c.task, s)
	case settleDrop:
		log.Info().Err(s.err).Msg("task dropped")
		e.settleErr(msg.Ack(), "ack")
	case settleRelease:
		if s.err != nil {
			log.Warn().Err(s.err).Msg("task released")
		}
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
	case settleFinish:
		err := e.finish(ctx, c.run, c.rev, s)
		if errors.Is(err, jetstream.ErrNotFound) {
			// The record is gone: nothing is left to finish. (A running
			// run's record never expires; one written before that rule
			// may have.)
			log.Error().Err(err).Msg("run record gone; task dropped")
		} else if err != nil {
			log.Warn().Err(err).Msg("cannot record run end; releasing")
			e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		e.cache.forget(c.runKey())
		e.settleErr(msg.Ack(), "ack")
	}
}

func (e *Executor) settleErr(err error, what string) {
	if err != nil {
		// The broker will redeliver after AckWait; the commit protocol makes
		// that harmless, so this is worth a log line, not more.
		e.log.Warn().Err(err).Str("settle", what).Msg("cannot settle task message")
	}
}

// dispatch publishes the task of stepID. A task already pending for that
// step, or one within the broker's duplicate window, absorbs this one.
func (e *Executor) dispatch(ctx context.Context, c *Context, stepID string) error {
	t := state.StepTask(c.run, c.rev, stepID)
	// A task that ran its own step hands over to the next one; any other
	// (a late redelivery, a duplicate's start task) only found the frontier.
	t.Redispatched = !c.executed
	b, err := state.Encode(t)
	if err != nil {
		return err
	}
	_, err = jetstream.PublishTask(ctx, e.cfg.Assets.JS, jetstream.TaskSubject(c.run.Workflow, c.run.RunID, stepID), stepID, b)
	return err
}

// lookup returns the committed record of stepID, from the cache or the
// steps bucket.
func (e *Executor) lookup(ctx context.Context, runKey, stepID string) (state.Step, bool, error) {
	if s, ok := e.cache.get(runKey, stepID); ok {
		return s, true, nil
	}
	v, _, err := e.cfg.Assets.Steps.Get(ctx, stepID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return state.Step{}, false, nil
	}
	if err != nil {
		return state.Step{}, false, err
	}
	s, err := state.DecodeStep(v)
	if err != nil {
		return state.Step{}, false, err
	}
	e.cache.put(runKey, s)
	return s, true, nil
}

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

// Release hands back a task that was fetched but never started (received
// while the worker was stopping). On its first delivery it first records
// that its attempt did not start, so that the redelivery runs the same
// attempt number, not the next.
func (e *Executor) Release(msg natsjs.Msg) error {
	if meta, err := msg.Metadata(); err == nil && meta.NumDelivered == 1 {
		if t, err := state.DecodeTask(msg.Data()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := e.cfg.Assets.Attempts.Create(ctx, attemptKey(t), []byte(strconv.Itoa(firstAttempt(t)-1)))
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrExists) {
				e.log.Warn().Err(err).Str("run_id", t.RunID).Msg("cannot record an unstarted attempt; the redelivery will count one more")
			}
		}
	}
	if h := e.cfg.Hooks.AfterRelease; h != nil {
		if t, err := state.DecodeTask(msg.Data()); err == nil {
			h(t.RunID)
		}
	}
	return msg.Nak()
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

// finish records the run's end with compare-and-set on the revision the
// task carried; when that revision is stale (another worker finished the
// run, or it changed since) it reads the record and tries again. A run
// already in a terminal state, or a record that now holds another run under
// the same ID (another token), is left as it is.
func (e *Executor) finish(ctx context.Context, run state.Run, rev uint64, s *settlement) error {
	run, written, err := runs.New(e.cfg.Assets).Finish(ctx, run, rev, func(run *state.Run) {
		run.UpdatedAt = e.cfg.Now().UTC()
		switch {
		case s.err == nil && len(s.output) > state.MaxInputBytes:
			run.Status, run.Error = state.StatusFailed, &state.ErrorInfo{
				Message: fmt.Sprintf("workflow output of %d bytes is over the %d-byte limit", len(s.output), state.MaxInputBytes),
				Kind:    "output", Fatal: true,
			}
		case s.err == nil:
			run.Status, run.Output = state.StatusCompleted, s.output
		default:
			run.Status, run.Error = state.StatusFailed, errorInfo(s)
		}
		if _, err := state.Encode(*run); errors.Is(err, state.ErrInputTooLarge) {
			// Input and output together do not fit in one record.
			run.Status, run.Output = state.StatusFailed, nil
			run.Error = &state.ErrorInfo{Message: "workflow output too large to store: " + err.Error(), Kind: "output", Fatal: true}
		}
	})
	if err != nil || !written {
		return err
	}
	e.cfg.Metrics.RunFinished(run.Workflow, string(run.Status), run.UpdatedAt.Sub(run.CreatedAt))
	return nil
}

func errorInfo(s *settlement) *state.ErrorInfo {
	var se *StepError
	switch {
	case s.panic:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "panic", Fatal: true}
	case errors.Is(s.err, ErrInput):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "input", Fatal: true}
	case errors.As(s.err, &se):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "step", Fatal: se.Fatal, Code: errorCode(s.err)}
	default:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "workflow", Fatal: isFatal(s.err), Code: errorCode(s.err)}
	}
}
