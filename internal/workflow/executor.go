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
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
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
	// NoHeartbeat stops running steps from extending their task's ack
	// deadline, as a paused or partitioned worker would fail to: the task
	// is redelivered while the step still runs (a zombie).
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
	// HeartbeatEvery is how often a running step's task is marked in
	// progress; keep it well within the consumer's AckWait.
	HeartbeatEvery time.Duration
	// ReleaseDelay is how long a released task waits before redelivery.
	ReleaseDelay time.Duration
	// CacheRuns bounds the history cache (runs).
	CacheRuns int
	Now       func() time.Time
	Hooks     Hooks
	Metrics   Metrics
}

// Metrics receives execution events. Nil fields are skipped.
type Metrics struct {
	StepSettled func(workflow, step, result string, d time.Duration)
	RunFinished func(workflow string, status state.Status)
	TaskDeduped func(layer string)
}

// Executor handles task messages. It is safe for concurrent use.
type Executor struct {
	cfg   Config
	cache *historyCache
	log   zerolog.Logger
}

// NewExecutor returns an executor.
func NewExecutor(cfg Config) *Executor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HeartbeatEvery == 0 {
		cfg.HeartbeatEvery = 10 * time.Second
	}
	if cfg.ReleaseDelay == 0 {
		cfg.ReleaseDelay = time.Second
	}
	if cfg.CacheRuns == 0 {
		cfg.CacheRuns = 10000
	}
	return &Executor{cfg: cfg, cache: newHistoryCache(cfg.CacheRuns), log: cfg.Logger}
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
	task, err := state.DecodeTask(msg.Data())
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Uint64("stream_seq", meta.Sequence.Stream).
			Msg("malformed task terminated")
		e.settleErr(msg.TermWithReason("malformed task: "+err.Error()), "term")
		return
	}
	log := e.log.With().Str("run_id", task.RunID).Str("workflow", task.Workflow).Logger()
	def, ok := e.cfg.Definitions[task.Workflow]
	if !ok {
		log.Error().Msg("task for a workflow this worker does not serve; releasing it")
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	nctx := context.WithoutCancel(ctx)
	run, rev, err := e.loadRun(nctx, task)
	if err != nil {
		log.Warn().Err(err).Msg("cannot load run; releasing task")
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	if run.Status.Terminal() {
		// A stale task (duplicate start, late redelivery): nothing to do.
		e.settleErr(msg.Ack(), "ack")
		return
	}
	c := &Context{
		ctx: ctx, nctx: nctx, exec: e, task: task, run: run, rev: rev,
		attempt: int(meta.NumDelivered), occ: make(map[string]int),
		inProgress: msg.InProgress, done: make(chan *settlement, 1),
	}
	s := e.replay(c, def)
	e.settle(nctx, log, msg, c, s)
}

// loadRun returns the run a task belongs to and the revision it was read
// at. A start task materialises the run record if its publisher died before
// writing it; a step task carries the record's fields.
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
			log.Warn().Err(err).Str("step_id", s.stepID).Msg("cannot publish next task; releasing")
			e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		e.settleErr(msg.Ack(), "ack")
	case settleRetry:
		e.settleErr(msg.NakWithDelay(s.delay), "nak")
	case settleRelease:
		if s.err != nil {
			log.Warn().Err(s.err).Msg("task released")
		}
		e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
	case settleFinish:
		if err := e.finish(ctx, c.run, c.rev, s); err != nil {
			log.Warn().Err(err).Msg("cannot record run end; releasing")
			e.settleErr(msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		e.cache.forget(c.run.RunID)
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
	r := c.run
	b, err := state.Encode(state.Task{
		V: state.Version, RunID: r.RunID, Workflow: r.Workflow, StepID: stepID, Input: r.Input,
		Token: r.Token, Source: r.Source, CreatedAt: r.CreatedAt, Rev: c.rev,
	})
	if err != nil {
		return err
	}
	d, err := jetstream.PublishTask(ctx, e.cfg.Assets.JS, jetstream.TaskSubject(c.run.Workflow, c.run.RunID, stepID), stepID, b)
	if err != nil {
		return err
	}
	if d != jetstream.Stored && e.cfg.Metrics.TaskDeduped != nil {
		e.cfg.Metrics.TaskDeduped(d.String())
	}
	return nil
}

// lookup returns the committed record of stepID, from the cache or the
// steps bucket.
func (e *Executor) lookup(ctx context.Context, runID, stepID string) (state.Step, bool, error) {
	if s, ok := e.cache.get(runID, stepID); ok {
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
	e.cache.put(s)
	return s, true, nil
}

// execute runs the step this task owns and commits its result, or suspends
// for a retry or a release. It returns the committed record, which is the
// one another worker committed first if this one lost the race.
func (e *Executor) execute(c *Context, name, id string, seq int, policy RetryPolicy, fn StepFunc) state.Step {
	info := StepInfo{StepID: id, StepName: name, Attempt: c.attempt, RunID: c.run.RunID, Workflow: c.run.Workflow}
	rec := state.Step{V: state.Version, StepID: id, RunID: c.run.RunID, Name: name, Seq: seq, Attempt: c.attempt, Worker: e.cfg.WorkerID}
	start := e.cfg.Now()
	result := "committed"
	if c.attempt > policy.MaxAttempts {
		// Deliveries beyond the budget (crash loops): fail without running.
		rec.Error = &state.ErrorInfo{Message: fmt.Sprintf("delivered %d times, more than MaxAttempts %d", c.attempt, policy.MaxAttempts), Kind: "step"}
		result = "failed"
	} else {
		out, err := e.call(c, info, fn)
		switch {
		case err == nil:
			rec.Output = out
		case c.ctx.Err() != nil:
			// The worker is stopping: this attempt did not finish.
			c.suspend(&settlement{kind: settleRelease, err: err})
		case isFatal(err):
			rec.Error = &state.ErrorInfo{Message: err.Error(), Fatal: true, Kind: "step"}
			result = "fatal"
		case c.attempt < policy.MaxAttempts:
			delay, ok := retryAfter(err)
			if !ok {
				delay = policy.Backoff(c.attempt)
			}
			e.log.Info().Str("run_id", info.RunID).Str("step_id", id).Int("attempt", c.attempt).
				Dur("retry_in", delay).Err(err).Msg("step failed; retrying")
			e.observeStep(c.run.Workflow, name, "retried", start)
			c.suspend(&settlement{kind: settleRetry, delay: delay, err: err})
		default:
			rec.Error = &state.ErrorInfo{Message: err.Error(), Kind: "step"}
			result = "failed"
		}
	}
	rec.Committed = e.cfg.Now().UTC()
	b, err := state.Encode(rec)
	if err != nil {
		c.suspend(&settlement{kind: settleRelease, err: err})
	}
	if _, err := e.cfg.Assets.Steps.Create(c.nctx, id, b); err != nil {
		if !errors.Is(err, jetstream.ErrExists) {
			c.suspend(&settlement{kind: settleRelease, err: err})
		}
		// Another worker committed first; its result is the result.
		v, _, gerr := e.cfg.Assets.Steps.GetExisting(c.nctx, id)
		if gerr != nil {
			c.suspend(&settlement{kind: settleRelease, err: gerr})
		}
		if rec, err = state.DecodeStep(v); err != nil {
			c.suspend(&settlement{kind: settleRelease, err: err})
		}
		e.log.Info().Str("run_id", info.RunID).Str("step_id", id).Msg("step was committed by another worker; keeping its result")
		result = "lost-race"
	}
	e.observeStep(c.run.Workflow, name, result, start)
	e.cache.put(rec)
	if h := e.cfg.Hooks.AfterCommit; h != nil {
		h(id, result != "lost-race")
	}
	return rec
}

// call runs fn with the step's info in its context, marking the task in
// progress while it runs and turning a panic into an error.
func (e *Executor) call(c *Context, info StepInfo, fn StepFunc) (out json.RawMessage, err error) {
	ctx := context.WithValue(c.ctx, stepInfoKey{}, info)
	if !e.cfg.Hooks.NoHeartbeat {
		defer heartbeat(e.cfg.HeartbeatEvery, func() {
			if err := c.inProgress(); err != nil {
				e.log.Warn().Err(err).Str("step_id", info.StepID).Msg("cannot extend task ack deadline")
			}
		})()
	}
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

// heartbeat calls beat every interval until the returned stop is called.
// It costs a timer, not a goroutine, while nothing is due.
func heartbeat(every time.Duration, beat func()) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	var tick func()
	tick = func() {
		beat()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	}
	mu.Lock()
	t = time.AfterFunc(every, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

func (e *Executor) observeStep(wf, step, result string, start time.Time) {
	if f := e.cfg.Metrics.StepSettled; f != nil {
		f(wf, step, result, e.cfg.Now().Sub(start))
	}
}

// finish records the run's end with compare-and-set on the revision the
// task carried; when that revision is stale (another worker finished the
// run, or it changed since) it reads the record and tries again. A run
// already in a terminal state is left as it is.
func (e *Executor) finish(ctx context.Context, run state.Run, rev uint64, s *settlement) error {
	for {
		if rev == 0 {
			v, r, err := e.cfg.Assets.Runs.GetExisting(ctx, run.RunID)
			if err != nil {
				return err
			}
			if run, err = state.DecodeRun(v); err != nil {
				return err
			}
			rev = r
		}
		if run.Status.Terminal() {
			return nil
		}
		run.UpdatedAt = e.cfg.Now().UTC()
		if s.err == nil {
			run.Status, run.Output = state.StatusCompleted, s.output
		} else {
			run.Status, run.Error = state.StatusFailed, errorInfo(s)
		}
		b, err := state.Encode(run)
		if err != nil {
			return err
		}
		_, err = e.cfg.Assets.Runs.Update(ctx, run.RunID, b, rev)
		if errors.Is(err, jetstream.ErrRevisionMismatch) {
			rev = 0
			continue
		}
		if err != nil {
			return err
		}
		if f := e.cfg.Metrics.RunFinished; f != nil {
			f(run.Workflow, run.Status)
		}
		return nil
	}
}

func errorInfo(s *settlement) *state.ErrorInfo {
	var se *StepError
	switch {
	case s.panic:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "panic", Fatal: true}
	case errors.Is(s.err, ErrInput):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "input", Fatal: true}
	case errors.As(s.err, &se):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "step", Fatal: se.Fatal}
	default:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "workflow", Fatal: isFatal(s.err)}
	}
}
