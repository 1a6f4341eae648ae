package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// Definition is a registered workflow with its types erased.
type Definition struct {
	Name string
	// Run is the workflow body. It decodes input, calls c.StepWithKey for every
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
	// AfterChildStart runs once a child step's child run was admitted, before its parent's task is settled.
	AfterChildStart func(stepID, childRunID string)
	// BeforeChildAdmit runs once a child step's link is in its parent's
	// record, before the child run is admitted.
	BeforeChildAdmit func(stepID, childRunID string)
	// NoHeartbeat (read by the Pool) stops tasks from extending their ack
	// deadline, as a paused or partitioned worker would fail to: the task
	// is redelivered while its step still runs (a zombie).
	NoHeartbeat bool
	// BeforeAttempt runs once a task's attempt at its step function is
	// numbered and the run checked, before a redelivery reads the step's
	// record again and the function runs.
	BeforeAttempt func(stepID string, attempt int)
	// WrapStep returns the function to run for the step called step of
	// workflow wf, whose own function is fn: fn itself, a wrapper or a
	// replacement (the test kit's step stubs and crash points). It is
	// asked every time a body starts a step.
	WrapStep func(wf, step string, fn StepFunc) StepFunc
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
	// TimerNow is the clock sleeps, wait timeouts and retry delays count
	// by (nil: Now); Schedule stores their timers on its time (nil: it is
	// real time). The test kit's time control sets both; records keep Now.
	TimerNow func() time.Time
	Schedule ScheduleFunc
	Hooks    Hooks
	// Metrics counts steps, runs and redeliveries (nil: none).
	Metrics *metrics.Metrics
	// Tracer emits step and run spans (nil: none).
	Tracer *tracing.Tracer
}

// Executor handles task messages. It is safe for concurrent use.
type Executor struct {
	cfg       Config
	cache     *historyCache
	cancelled *cancelSet
	inflight  *inflight
	runs      *runs.Store
	log       zerolog.Logger
}

// NewExecutor returns an executor.
func NewExecutor(cfg Config) *Executor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TimerNow == nil {
		cfg.TimerNow = cfg.Now
	}
	if cfg.ReleaseDelay == 0 {
		cfg.ReleaseDelay = time.Second
	}
	if cfg.CacheRuns == 0 {
		cfg.CacheRuns = 10000
	}
	return &Executor{
		cfg: cfg, cache: newHistoryCache(cfg.CacheRuns), cancelled: newCancelSet(cfg.CacheRuns), inflight: newInflight(),
		runs: runs.New(cfg.Assets), log: cfg.Logger,
	}
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
	// The delivery is made first and filled in: the task and the run are
	// large, and a copy of each in this frame would make the goroutine's
	// stack grow (a copy of the whole stack) more often.
	d := &delivery{ctx: ctx, nctx: context.WithoutCancel(ctx), delivered: int(meta.NumDelivered)}
	if d.task, err = state.DecodeTask(msg.Data()); err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Uint64("stream_seq", meta.Sequence.Stream).
			Msg("malformed task terminated")
		settleErr(e.log, msg.TermWithReason("malformed task: "+err.Error()), "term")
		return
	}
	d.log = RunLogger(e.log, d.task.Workflow, d.task.RunID)
	lc := d.log.With()
	if d.task.StepID != "" {
		lc = lc.Str("step_id", d.task.StepID)
	}
	log := lc.Uint64("delivered", meta.NumDelivered).Logger()
	if meta.NumDelivered > 1 {
		e.cfg.Metrics.Redelivered(d.task.Workflow)
	}
	def, ok := e.cfg.Definitions[d.task.Workflow]
	if !ok {
		log.Error().Msg("task for a workflow this worker does not serve; releasing it")
		settleErr(log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	d.run, d.rev, err = e.loadRun(d.nctx, &d.task)
	if errors.Is(err, dedupe.ErrStaleStart) {
		// A start answered by a run that has since expired (a duplicate's
		// task left in the stream, a task consumed after the retention):
		// it must never create a d.run.
		log.Warn().Err(err).Int("generation", d.task.Generation).Msg("stale start task dropped: its run expired; no run created")
		settleErr(log, msg.Ack(), "ack")
		return
	}
	if err != nil {
		log.Warn().Err(err).Msg("cannot load run; releasing task")
		settleErr(log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	if d.run.Workflow != d.task.Workflow {
		// A start of another workflow under this run ID (after the broker's
		// window): the stored run wins and this task must not touch it.
		log.Error().Str("stored_workflow", d.run.Workflow).Msg("task for a run of another workflow dropped")
		settleErr(log, msg.Ack(), "ack")
		return
	}
	if d.run.Status.Terminal() || (d.task.StepID == "" && d.task.Generation != d.run.Generation) ||
		e.cancelled.has(d.run.RunID, d.run.Token) {
		// A stale task (duplicate start, late redelivery, a start task of a
		// generation that is not the run's): nothing to do. The current
		// generation always has a start task of its own. A child run that
		// ended may not have told its parent yet (its worker died between
		// the two writes): tell it again.
		if err := e.notifyParent(d.nctx, d.run); err != nil {
			log.Warn().Err(err).Msg("cannot tell the parent that its child ended; releasing")
			settleErr(log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		settleErr(log, msg.Ack(), "ack")
		return
	}
	untrack := e.inflight.track(d, ctx)
	defer untrack()
	s := e.replay(d, def)
	e.settle(d.nctx, log, msg, d, s)
}

// delivery is one delivery of a task message with the run it belongs to:
// what replaying the run, executing its step and settling the message read.
// Handle builds it; nothing changes it afterwards.
type delivery struct {
	// ctx is cancelled when the worker gives up on in-flight steps, or
	// when the run is cancelled (cause ErrRunCancelled); steps and the
	// body run with it. nctx is never cancelled (NATS operations get the
	// JetStream default timeout), so a finished step is still committed and
	// acknowledged during a drain.
	ctx  context.Context
	nctx context.Context
	task state.Task
	run  state.Run
	rev  uint64 // of run; 0 when unknown
	// delivered is the task message's delivery count.
	delivered int
	// log carries the run's workflow and run_id (RunLogger).
	log zerolog.Logger
}

// RunLogger is log with the fields every line about a run carries:
// workflow and run_id.
func RunLogger(log zerolog.Logger, workflow, runID string) zerolog.Logger {
	return log.With().Str("workflow", workflow).Str("run_id", runID).Logger()
}

// taskSubject is the subject of the task being handled.
func (d *delivery) taskSubject() string {
	if d.task.StepID != "" {
		return jetstream.TaskSubject(d.run.Workflow, d.run.RunID, d.task.StepID)
	}
	return jetstream.TaskSubject(d.run.Workflow, state.RunIdentity(d.run.RunID, d.run.Generation), "")
}

// runKey identifies this run in the history cache: the run ID and the token
// of the start that created it, so that a run ID reused after its retention
// never sees the earlier run's steps.
func (d *delivery) runKey() string { return d.run.RunID + "/" + d.run.Token }

// loadRun returns the run a task belongs to and the revision it was read
// at. A start task materialises the run record if its publisher died before
// writing it (dedupe.ErrStaleStart: the task must be dropped); a step task
// carries the record's fields.
func (e *Executor) loadRun(ctx context.Context, t *state.Task) (state.Run, uint64, error) {
	if t.StepID == "" {
		return e.cfg.Admitter.Materialize(ctx, *t)
	}
	return state.RunFromTask(*t), t.Rev, nil
}

// Release hands back a task that was fetched but never started (received
// while the worker was stopping). On its first delivery it first records
// that its attempt did not start, so that the redelivery runs the same
// attempt number, not the next.
func (e *Executor) Release(msg natsjs.Msg) error {
	if meta, err := msg.Metadata(); err == nil && meta.NumDelivered == 1 {
		if t, err := state.DecodeTask(msg.Data()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			b, err := state.Encode(state.AttemptLog{V: state.Version, Started: firstAttempt(t) - 1})
			if err == nil {
				_, err = e.cfg.Assets.Attempts.Create(ctx, attemptKey(t), b)
			}
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrExists) {
				log := RunLogger(e.log, t.Workflow, t.RunID)
				log.Warn().Err(err).Msg("cannot record an unstarted attempt; the redelivery will count one more")
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
