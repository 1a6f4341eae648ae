package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
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
	// Pinned: a run is executed only by workers of the build that started
	// it (state.Run.Build); a task of it that a worker of another build
	// receives is handed back untouched.
	Pinned bool
	// Patches are the patch IDs the body may ask about (Context.Patched).
	Patches []string
}

// Hooks let tests inject faults at exact points. Nil hooks do nothing.
type Hooks struct {
	// AfterCommit runs after a step's commit was attempted and before the
	// body goes on. won is false when the commit was refused: another
	// attempt committed the step first, or this holder lost its lease.
	AfterCommit func(stepID string, won bool)
	// AfterRelease runs when a task fetched but never started was handed
	// back (Release), with its run ID.
	AfterRelease func(runID string)
	// AfterChildStart runs once a child step's child run was admitted,
	// before the parent goes on.
	AfterChildStart func(stepID, childRunID string)
	// BeforeChildAdmit runs once a child step's link is in its parent's
	// record, before the child run is admitted.
	BeforeChildAdmit func(stepID, childRunID string)
	// NoHeartbeat makes a worker behave as a paused process: it neither
	// extends its tasks' ack deadlines nor renews its leases, so its tasks
	// are redelivered while their steps still run (a zombie).
	NoHeartbeat bool
	// NoAckExtension drops only the ack-deadline extensions: the tasks are
	// redelivered, but the worker, alive, renews its leases (heartbeats
	// lost on the way to the broker).
	NoAckExtension bool
	// BeforeAttempt runs once an attempt at a step function is numbered,
	// right before the function runs.
	BeforeAttempt func(stepID string, attempt int)
	// WrapStep returns the function to run for the step called step of
	// workflow wf, whose own function is fn: fn itself, a wrapper or a
	// replacement (the test kit's step stubs and crash points). It is
	// asked every time a body starts a step.
	WrapStep func(wf, step string, fn StepFunc) StepFunc
	// BeforeIndex runs after a run record's write that changed the run's
	// status and before its index entry is written
	// (jetstream.Assets.BeforeIndex).
	BeforeIndex func(runID string)
	// AfterCreate runs after a run record was created, before anything
	// else (jetstream.Assets.AfterCreate).
	AfterCreate func(runID string)
	// AfterFinish runs once a holder has written its run's end (and told
	// its parent), before it acknowledges the run's task.
	AfterFinish func(runID string)
	// BeforeParkAck runs when a parking holder's look found nothing to
	// decide, before it acknowledges the task: a stall point for tests.
	BeforeParkAck func(runID string)
	// AfterPark runs once a holder has parked a run (its lease written
	// parked, nothing it waits for committed, its task acknowledged),
	// with the run ID and the steps the body waits for.
	AfterPark func(runID string, waits []string)
}

// Config configures an Executor.
type Config struct {
	Assets      *jetstream.Assets
	Admitter    *dedupe.Admitter
	Definitions map[string]Definition
	Logger      zerolog.Logger
	// WorkerID is written into step records and leases for diagnosis.
	WorkerID string
	// Build is the build identity of the worker's code, written where the
	// code decided something: a run's block.
	Build string
	// BlockRecheck is how long after a run is blocked its first recheck
	// comes (0: DefaultBlockRecheck); see block.go.
	BlockRecheck time.Duration
	// ReleaseDelay is how long a released task waits before redelivery.
	ReleaseDelay time.Duration
	Now          func() time.Time
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
	// Canceller is the process's cancel path (nil: the executor's own,
	// over Assets, Metrics and Tracer). The executor cancels a cancelled
	// parent's children with it, and finishes the cancel of a run whose
	// lease says cancelled while its record still runs (the canceller
	// died between its two writes).
	Canceller *Canceller
	// Stopping reports whether the worker is draining (nil: never): a
	// holder then starts no further sequential step, and hands its run to
	// another worker at the step boundary instead.
	Stopping func() bool
	// NewRuns reports whether the worker starts new runs of the pinned
	// workflow wf (nil: always): a worker of a build that a newer build
	// superseded serves only the runs pinned to its own, and hands the
	// start of a new one back for a worker of the newer build.
	NewRuns func(wf string) bool
	// BuildLive reports whether a live worker of build serves workflow wf
	// (nil: never known): a task handed back to such a build is delivered
	// again soon (bounceDelay), one of a build no worker runs now slowly.
	BuildLive func(wf, build string) bool
}

// Executor executes runs: it is the handler of the run tasks and of the
// branch tasks of the workflows it serves. It is safe for concurrent use.
type Executor struct {
	cfg      Config
	inflight *inflight
	runs     *runs.Store
	cancels  *Canceller
	log      zerolog.Logger
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
	if cfg.BlockRecheck == 0 {
		cfg.BlockRecheck = DefaultBlockRecheck
	}
	e := &Executor{cfg: cfg, inflight: newInflight(), runs: runs.New(cfg.Assets), cancels: cfg.Canceller, log: cfg.Logger}
	if e.cancels == nil {
		e.cancels = NewCanceller(cfg.Assets, e.runs, cfg.Metrics, cfg.Tracer, false)
	}
	return e
}

// Runs is the handler of run tasks (jetstream.RunTasks): every delivery
// hands a run's body to a holder (holder.go).
func (e *Executor) Runs() consume.Handler { return runHandler{e} }

// Branches is the handler of branch tasks (jetstream.BranchTasks): every
// delivery runs one branch step (branch.go).
func (e *Executor) Branches() consume.Handler { return branchHandler{e} }

type runHandler struct{ e *Executor }

func (h runHandler) Handle(ctx context.Context, d *consume.Delivery) {
	if !h.e.handBackIfStopping(d) {
		h.e.handleRun(ctx, d)
	}
}
func (h runHandler) Release(msg natsjs.Msg, delay time.Duration) error {
	return h.e.release(msg, delay)
}

type branchHandler struct{ e *Executor }

func (h branchHandler) Handle(ctx context.Context, d *consume.Delivery) {
	if !h.e.handBackIfStopping(d) {
		h.e.handleBranch(ctx, d)
	}
}
func (h branchHandler) Release(msg natsjs.Msg, delay time.Duration) error {
	return h.e.release(msg, delay)
}

// stopping reports whether the worker drains (Config.Stopping).
func (e *Executor) stopping() bool { return e.cfg.Stopping != nil && e.cfg.Stopping() }

// handBackIfStopping hands d back unstarted, as one received while the
// pool stops (release), when the worker drains: a draining worker's pool
// still pulls until its handlers are done, and a task it takes then would
// otherwise start work the drain waits for.
func (e *Executor) handBackIfStopping(d *consume.Delivery) bool {
	if !e.stopping() {
		return false
	}
	settleErr(e.log, e.release(d.Msg, d.HandBackDelay()), "nak")
	return true
}

// delivery is one delivery of a task with the run it belongs to: what
// replaying the run, executing a step and settling the message read.
type delivery struct {
	// ctx is cancelled when the worker gives up on in-flight steps, or
	// when the run is cancelled (cause ErrRunCancelled) or its lease lost
	// (cause errLeaseLost); steps and the body run with it. nctx is never
	// cancelled (NATS operations get the JetStream default timeout), so a
	// finished step is still committed and acknowledged during a drain.
	ctx  context.Context
	nctx context.Context
	task state.Task
	run  state.Run
	rev  uint64 // of run; 0 when unknown
	msg  *consume.Delivery
	seq  uint64 // the task message's stream sequence
	// delivered is the task message's delivery count.
	delivered int
	// role is what a run task is to its run (startRole), and startLease
	// the run's lease record as a start task's delivery read it beside
	// the run's record (nil: never written, or a wake's).
	role       taskRole
	startLease *state.Lease
	// log carries the run's workflow and run_id (RunLogger), the task's
	// delivery count, and its step: a branch task's as step_id (logStep),
	// a wake's as wake_step_id.
	log     zerolog.Logger
	logStep string
}

// stepLogger is d.log for lines about step id: with its step_id, which a
// branch task's logger carries already.
func (d *delivery) stepLogger(id string) zerolog.Logger {
	if id == d.logStep {
		return d.log
	}
	return d.log.With().Str("step_id", id).Logger()
}

// stepEvent is ev about step id: with step_id, unless d.log carries it.
func (d *delivery) stepEvent(ev *zerolog.Event, id string) *zerolog.Event {
	if id == d.logStep {
		return ev
	}
	return ev.Str("step_id", id)
}

// newDelivery decodes the task of d and prepares its logger. A message
// that cannot be a task is terminated (nil).
func (e *Executor) newDelivery(ctx context.Context, d *consume.Delivery) *delivery {
	msg := d.Msg
	meta, err := msg.Metadata()
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Msg("task without JetStream metadata; leaving it")
		return nil
	}
	task, err := state.DecodeTask(msg.Data())
	if err != nil {
		e.log.Error().Err(err).Str("subject", msg.Subject()).Uint64("stream_seq", meta.Sequence.Stream).
			Msg("malformed task terminated")
		settleErr(e.log, msg.TermWithReason("malformed task: "+err.Error()), "term")
		return nil
	}
	lc := RunLogger(e.log, task.Workflow, task.RunID).With()
	logStep := ""
	switch {
	case task.StepID == "":
	case jetstream.IsRunSubject(msg.Subject()):
		// A wake names the step it is about; the lines of the steps its
		// holder runs name their own (step_id).
		lc = lc.Str("wake_step_id", task.StepID)
	default:
		lc, logStep = lc.Str("step_id", task.StepID), task.StepID
	}
	if meta.NumDelivered > 1 {
		e.cfg.Metrics.Redelivered(task.Workflow)
	}
	return &delivery{
		ctx: ctx, nctx: context.WithoutCancel(ctx), task: task, msg: d, seq: meta.Sequence.Stream,
		delivered: int(meta.NumDelivered), log: lc.Uint64("delivered", meta.NumDelivered).Logger(), logStep: logStep,
	}
}

// RunLogger is log with the fields every line about a run carries:
// workflow and run_id.
func RunLogger(log zerolog.Logger, workflow, runID string) zerolog.Logger {
	return log.With().Str("workflow", workflow).Str("run_id", runID).Logger()
}

// identity is the run generation's identity (state.RunIdentity).
func (d *delivery) identity() string { return state.RunIdentity(d.run.RunID, d.run.Generation) }

// release hands back a task that was fetched but never started (received
// while the worker was stopping), recording first that its delivery did
// not start anything, so that its redelivery counts no attempt for it: a
// branch task in its step's attempt log, a run task in the run's lease
// (handBack). It is delivered again after delay.
func (e *Executor) release(msg natsjs.Msg, delay time.Duration) error {
	t, derr := state.DecodeTask(msg.Data())
	meta, merr := msg.Metadata()
	if derr == nil && merr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var err error
		switch {
		case jetstream.IsRunSubject(msg.Subject()):
			err = e.handBack(ctx, t, meta.Sequence.Stream, int(meta.NumDelivered))
		case meta.NumDelivered == 1:
			var b []byte
			if b, err = state.Encode(state.AttemptLog{V: state.Version, Started: max(1, t.Attempt) - 1}); err == nil {
				_, err = e.cfg.Assets.Attempts.Create(ctx, t.StepID, b)
			}
			if errors.Is(err, jetstream.ErrExists) {
				err = nil
			}
		}
		cancel()
		if err != nil {
			log := RunLogger(e.log, t.Workflow, t.RunID)
			log.Warn().Err(err).Msg("cannot record an unstarted delivery; the redelivery will count one more attempt")
		}
	}
	if h := e.cfg.Hooks.AfterRelease; h != nil && derr == nil {
		h(t.RunID)
	}
	return consume.NakAfter(msg, delay)
}

// handBack records in the run's lease that the delivery delivered of run
// task t (stream sequence seq) hands it back unstarted, with how it found
// the run: its redelivery takes the run as this delivery would have (see
// hold). A lease held by another delivery, or cancelled, is left as it is.
func (e *Executor) handBack(ctx context.Context, t state.Task, seq uint64, delivered int) error {
	key := state.LeaseKey(state.RunIdentity(t.RunID, t.Generation))
	v, rev, err := e.cfg.Assets.Steps.Get(ctx, key)
	rec := state.Lease{V: state.Version, State: state.LeaseReleased, Worker: e.cfg.WorkerID, Seq: seq, Delivered: delivered,
		Unstarted: true, At: e.cfg.Now().UTC()}
	switch {
	case errors.Is(err, jetstream.ErrNotFound):
		rec.Clean = !t.Wake && delivered == 1 // the fresh start task
		rec.Inherited = !rec.Clean
	case err != nil:
		return err
	default:
		found, err := state.DecodeLease(v)
		if err != nil {
			return err
		}
		rec.Passed = found.PassedAwaits()
		rec.Waits, rec.Places, rec.All, rec.Began = found.Waits, found.Places, found.All, found.Began
		rec.Begun, rec.BegunPlaces = found.Begun, found.BegunPlaces
		switch {
		case found.Unstarted && found.Seq == seq:
			rec.Clean, rec.Inherited, rec.Epoch = found.Clean, found.Inherited, found.Epoch
			if found.Delivered != delivered-1 {
				// A delivery in between may have taken the run without a
				// write and started a step: this write fences it, and the
				// redelivery takes the run as one that may have.
				rec.Clean, rec.Inherited = false, true
			}
		case found.State == state.LeaseParked && found.Seq != seq && !t.Wake:
			return nil // a stray start task (startRole): its redelivery is dropped as this one would have been
		case found.State == state.LeaseParked && found.Seq != seq:
			rec.Clean, rec.Epoch = true, found.Epoch
		default:
			return nil // held, handed back or cancelled by others: theirs to say
		}
	}
	b, err := state.Encode(rec)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = e.cfg.Assets.Steps.Create(ctx, key, b)
	} else {
		_, err = e.cfg.Assets.Steps.Update(ctx, key, b, rev)
	}
	if errors.Is(err, jetstream.ErrExists) || errors.Is(err, jetstream.ErrRevisionMismatch) {
		return nil // written meanwhile: the redelivery judges that
	}
	return err
}

// settleErr logs err, the failure to settle a task message with what.
func settleErr(log zerolog.Logger, err error, what string) {
	if err != nil {
		// The broker will redeliver after AckWait; the lease and the
		// commit protocol make that harmless, so this is worth a log line.
		log.Warn().Err(err).Str("settle", what).Msg("cannot settle task message")
	}
}
