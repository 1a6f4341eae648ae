package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/kit"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/sweep"
	"github.com/jetflow/jetflow/internal/workflow"
)

// WorkerConfig configures a Worker. Zero fields take the defaults.
type WorkerConfig struct {
	// Name identifies the worker in logs and step records (default
	// hostname-pid-random).
	Name string
	// Build identifies this worker's code: 1..64 characters of
	// [A-Za-z0-9._+-] (a VCS revision, a version, a release name). It is
	// recorded where the code decided something (the block of a run whose
	// code diverged from its history) and shown with the worker (Roster).
	// Empty: the binary's VCS revision (its first 12 characters, "+dirty"
	// when the tree was modified), when the Go toolchain stamped one (go
	// build or go install of a main package in a checkout), else none.
	Build string
	// CheckBeforeServing makes Start replay the worker's code against the
	// history of every run in flight of its workflows (Client.CheckCode)
	// before it takes any work, and fail with a *CodeCheckError when the
	// code would block some: a deploy whose code diverges from runs under
	// way then waits (the worker command stays unready and tries again)
	// instead of blocking them.
	CheckBeforeServing bool
	// Concurrency is how many tasks (steps) run at once (default 64).
	Concurrency int
	// AckWait is how long the broker waits for a task's acknowledgement
	// before redelivering it to another worker (default 30s). Running steps
	// extend it every AckWait/3, so it bounds how fast a crashed worker's
	// step is picked up again, not how long a step may run.
	//
	// AckWait is a deployment-wide setting, kept on each workflow's shared
	// consumers: the worker that creates a consumer sets it, and every
	// worker follows the consumer's value while it runs (re-read every few
	// seconds). A worker started with another value keeps the deployment's
	// and logs a warning, unless ApplyAckWait is set.
	AckWait time.Duration
	// ApplyAckWait makes this worker's AckWait the deployment's when it
	// starts: a longer one is applied at once; a shorter one is announced
	// first and applied once running workers have had time to heartbeat
	// for it (Start then takes up to a third of the old value plus 10s).
	ApplyAckWait bool
	// Topology must match the clients'.
	Topology Topology
	// Logger receives structured logs. The zero Logger means warnings and
	// errors to stderr (JSON lines, or a console format on a terminal);
	// zerolog.Nop() discards everything.
	Logger zerolog.Logger
	// Metrics receives the worker's metrics (nil: none); see NewMetrics.
	Metrics *Metrics
	// Tracing emits spans of starts, runs and steps (nil: none); see
	// WithTracerProvider.
	Tracing *Tracing
	// BacklogInterval is how often the worker samples its consumers'
	// backlogs for Metrics, and the start stream for envelopes of workflows
	// no worker serves (default 15s).
	BacklogInterval time.Duration
	// SweepInterval is how often the worker's sweeper looks for stuck runs:
	// running, with no pending task or timer (default 1m; negative: no
	// sweeper). See docs/operations.md, "Stuck runs".
	SweepInterval time.Duration
	// StuckAfter is how long a run is left alone, after its creation or
	// after it was last seen with a pending task, before the sweeper checks
	// it (default 5m, or 3 × AckWait when that is more; at least 3 ×
	// AckWait).
	StuckAfter time.Duration
	// LivenessTTL is how long the worker's liveness records in the
	// jetflow_workflows bucket outlive its last heartbeat (default 15s;
	// whole seconds, at least 1s). The worker rewrites them every third of
	// it while it runs and withdraws them on Stop; a worker that dies
	// without Stop is no longer listed once LivenessTTL has passed. Starting
	// also records each of its workflows as known to the deployment, for
	// good: a start that no worker answers is then ErrUnavailable (no
	// worker running) for a known workflow, ErrUnknownWorkflow for a name
	// no worker ever served while some worker is live (with none live, any
	// name is ErrUnavailable: the deployment's workers may not have
	// reported yet).
	LivenessTTL time.Duration

	// Kit is set by package jetflowtest: its fault hooks, step stubs,
	// clock and timer store (WithDefaults applies them). A program leaves
	// it nil.
	Kit *kit.WorkerOptions

	// hooks inject faults in tests.
	hooks workflow.Hooks
	// now is the clock sleeps, wait timeouts and retry delays count by
	// (nil: time.Now; records keep real time); the test kit's time control
	// sets it, and schedule, which stores timers on its time.
	now      func() time.Time
	schedule workflow.ScheduleFunc
	// sweepHook sees the report of every sweep pass (tests).
	sweepHook func(sweep.Pass)
	// blockRecheck is how long after a run is blocked its first recheck
	// comes (0: workflow.DefaultBlockRecheck; tests shorten it).
	blockRecheck time.Duration
}

// WithDefaults fills unset fields.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if k := c.Kit; k != nil {
		c.hooks, c.now, c.schedule, c.Kit = k.Hooks, k.Now, k.Schedule, nil
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomSuffix())
	}
	if c.Build == "" {
		c.Build = vcsBuild()
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.LivenessTTL == 0 {
		c.LivenessTTL = 15 * time.Second
	}
	if isZeroLogger(c.Logger) {
		c.Logger = defaultLogger()
	}
	return c
}

func (c WorkerConfig) validate() error {
	if c.Build != "" {
		if err := state.ValidateBuild(c.Build); err != nil {
			return fmt.Errorf("jetflow: worker config: Build: %w", err)
		}
	}
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("jetflow: worker config: Concurrency must be at least 1, got %d", c.Concurrency)
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("jetflow: worker config: AckWait must be at least 100ms, got %s", c.AckWait)
	case c.LivenessTTL < roster.MinTTL:
		return fmt.Errorf("jetflow: worker config: LivenessTTL must be at least %s, got %s", roster.MinTTL, c.LivenessTTL)
	}
	return c.validateSweep()
}

// Worker executes the runs of the workflows in its registry. Run as many
// workers as you like against one NATS deployment: they share each
// workflow's durable consumer.
type Worker struct {
	nc   *nats.Conn
	ws   *Registry
	cfg  WorkerConfig
	log  zerolog.Logger
	pool *consume.Pool

	mu        sync.Mutex
	started   bool
	stopServe func(context.Context) error
	// serving is what Ready checks, set once Start succeeded and cleared
	// when Stop begins; read without mu, so that a readiness probe never
	// waits for a drain.
	serving atomic.Pointer[serving]
	// draining is set when Stop begins: holders start no further
	// sequential step and hand their runs over (workflow.Config.Stopping).
	draining atomic.Bool
	// gate keeps the worker from executing beside workers of another
	// engine protocol (enginegate.go).
	gate engineGate
	// since is when the worker announced itself (roster.Presence.Since).
	since time.Time
}

// serving is a started worker's resources, for Ready.
type serving struct {
	assets    *jetstream.Assets
	consumers []natsjs.Consumer
}

// NewWorker returns a worker for the workflows in ws. It does not touch NATS
// until Start.
func NewWorker(nc *nats.Conn, ws *Registry, cfg WorkerConfig) (*Worker, error) {
	if err := checkConn(nc); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(ws.defs) == 0 {
		return nil, errors.New("jetflow: worker has no workflows registered")
	}
	if err := ws.checkRetention(jetstream.TopologyWithDefaults(cfg.Topology).Retention); err != nil {
		return nil, err
	}
	for name, wf := range ws.defs {
		if wf.Definition().Pinned && cfg.Build == "" {
			return nil, fmt.Errorf("jetflow: workflow %s is pinned to the build that starts each run: %w: the worker has none (set WorkerConfig.Build, or build the binary from a VCS checkout)", name, ErrInvalidBuild)
		}
	}
	if cfg.Metrics.internal().Role() == metrics.RoleClient {
		return nil, ErrClientMetrics
	}
	w := &Worker{nc: nc, ws: ws, cfg: cfg, log: cfg.Logger.With().Str("worker", cfg.Name).Logger()}
	w.gate.log = w.log
	return w, nil
}

// failedStartUnwind bounds the undoing of what a failed Start had set
// up. Consumers started before the failure may be running tasks: those
// still running then are cancelled (a step's commit is fenced by its
// run's lease, and its task is redelivered).
const failedStartUnwind = 10 * time.Second

// Start provisions the engine's streams and buckets and each workflow's
// consumers (idempotently), then starts executing tasks, answering start
// requests and admitting durable starts. A second call fails. A call that
// failed has undone what it set up (within failedStartUnwind), and may be
// made again: the worker command does so while NATS or JetStream cannot
// serve a start yet.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("jetflow: worker already started")
	}
	w.draining.Store(false)
	// Nothing is provisioned or executed beside a worker of another engine
	// protocol (an earlier version's, during an upgrade).
	if err := w.gate.check(ctx, w); err != nil {
		return err
	}
	assets, err := jetstream.Provision(ctx, w.nc, w.cfg.Topology, jetstream.CreateOrUpdate, jetstream.LogChanges(w.logConsumer))
	if err != nil {
		return err
	}
	assets.IndexFailed = func(runID string, err error) {
		w.log.Warn().Str("run_id", runID).Err(err).Msg("run index entry not written; readers repair it")
	}
	assets.BeforeIndex = w.cfg.hooks.BeforeIndex
	assets.AfterCreate = w.cfg.hooks.AfterCreate
	if rebuilt, err := runs.New(assets).EnsureIndex(ctx); err != nil {
		return err
	} else if rebuilt {
		w.log.Info().Msg("run index built from the run records")
	}
	sweeper, err := w.newSweeper(assets)
	if err != nil {
		return err
	}
	eng := newEngine(assets, w.cfg.Metrics.internal(), w.cfg.Tracing.internal(), w.log, false)
	if w.cfg.CheckBeforeServing {
		if err := w.checkCode(ctx, assets, eng); err != nil {
			return err
		}
	}
	w.cfg.Metrics.internal().Serve(w.ws.Names()...) // alerts must see each first event
	w.cfg.Metrics.watch(w.nc)
	defs := make(map[string]workflow.Definition, len(w.ws.defs))
	served := make(map[string]startproto.Served, len(w.ws.defs))
	for name, wf := range w.ws.defs {
		defs[name] = wf.Definition()
		if served[name], err = wf.served(); err != nil {
			return err // Register refused it already
		}
	}
	pool := consume.New(w.nc, w.cfg.Concurrency, w.cfg.hooks.NoHeartbeat || w.cfg.hooks.NoAckExtension, w.log)
	// stops undoes what Start sets up beyond the pool (which Stop drains
	// apart), last first: on a failure here, and in Stop. A failure undoes
	// it within failedStartUnwind of its own, since Start's context may be
	// the cause (it ended). Start returns the failure's own error, which
	// says whether trying again may help (a caller tells transient from
	// permanent by it); what the undoing reports is logged.
	var stops stopStack
	fail := func(err error) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedStartUnwind)
		defer cancel()
		if uerr := errors.Join(stops.unwind(ctx), pool.Stop(ctx)); uerr != nil {
			w.log.Warn().Err(uerr).Msg("undoing a failed start")
		}
		return err
	}
	exec := workflow.NewExecutor(workflow.Config{
		Assets: assets, Admitter: eng.admit, Definitions: defs, Logger: w.log,
		WorkerID: w.cfg.Name, Build: w.cfg.Build, BlockRecheck: w.cfg.blockRecheck, Hooks: w.cfg.hooks, Metrics: w.cfg.Metrics.internal(),
		Tracer: w.cfg.Tracing.internal(), TimerNow: w.cfg.now, Schedule: w.cfg.schedule,
		Canceller: eng.cancels, Stopping: func() bool { return w.draining.Load() || w.gate.paused.Load() },
		NewRuns: func(wf string) bool { return !w.gate.superseded(wf) }, BuildLive: w.gate.buildLive,
	})
	cc := jetstream.ConsumerConfig{AckWait: w.cfg.AckWait, ApplyAckWait: w.cfg.ApplyAckWait,
		MaxAckPending: 64 * w.cfg.Concurrency, Log: w.logConsumer}
	var consumers []natsjs.Consumer
	for name := range defs {
		for kind, h := range map[jetstream.TaskKind]consume.Handler{
			jetstream.RunTasks:    exec.Runs(),
			jetstream.BranchTasks: exec.Branches(),
		} {
			c, err := assets.EnsureConsumer(ctx, name, kind, cc)
			if err != nil {
				return fail(err)
			}
			if err := pool.Consume(c, w.cfg.Concurrency, h); err != nil {
				return fail(fmt.Errorf("jetflow: consume %s: %w", name, err))
			}
			consumers = append(consumers, c)
		}
	}
	if err := w.consumeLegacy(ctx, assets, pool, exec.Legacy()); err != nil {
		return fail(err)
	}
	// Due timers (retries after a long backoff) are moved into the task
	// stream by a few slots of their own, never waiting behind steps.
	duePool := consume.New(w.nc, dueSlots, false, w.log)
	stops.push(duePool.Stop)
	dueCons, err := assets.EnsureDueConsumer(ctx, cc)
	if err == nil {
		err = duePool.Consume(dueCons, dueSlots, &workflow.DueForwarder{JS: assets.JS, Log: w.log})
	}
	if err != nil {
		return fail(fmt.Errorf("jetflow: consume due timers: %w", err))
	}
	// Due expiries (the records of ended runs to remove) share those
	// slots, one at a time.
	expCons, err := assets.EnsureExpiryConsumer(ctx, cc)
	if err == nil {
		err = duePool.Consume(expCons, 1, &workflow.Expirer{Assets: assets, Log: w.log})
	}
	if err != nil {
		return fail(fmt.Errorf("jetflow: consume due expiries: %w", err))
	}
	consumers = append(consumers, dueCons, expCons)
	notices, err := w.nc.Subscribe(jetstream.CancelSubjectPrefix+"*", func(m *nats.Msg) {
		exec.MarkCancelled(strings.TrimPrefix(m.Subject, jetstream.CancelSubjectPrefix), string(m.Data))
	})
	if err != nil {
		return fail(fmt.Errorf("jetflow: subscribe to cancellations: %w", err))
	}
	stops.pushFunc(notices.Unsubscribe)
	// Durable starts (jetflow.start.<workflow>): a few at a time per
	// workflow, admitted like every other start.
	stopDurable, startConsumers, err := startproto.ServeDurable(ctx, assets, eng.admit, served, startproto.DurableConfig{
		AckWait: w.cfg.AckWait, ApplyAckWait: w.cfg.ApplyAckWait, Concurrency: min(4, w.cfg.Concurrency),
	}, w.log)
	if err != nil {
		return fail(err)
	}
	stops.push(stopDurable)
	consumers = append(consumers, startConsumers...)
	stopStarts, err := startproto.Serve(w.nc, eng.admit, served, reruns{assets: assets, runs: eng.runs}, 10*time.Second, w.log)
	if err != nil {
		return fail(err)
	}
	stops.pushFunc(stopStarts)
	events := &eventproto.Service{
		NC: w.nc, Served: w.eventChecks(), Timeout: 10 * time.Second, Log: w.log, Metrics: w.cfg.Metrics.internal(),
		Sender: workflow.Sender{Assets: assets, Runs: runs.New(assets), Now: time.Now}, Tracer: w.cfg.Tracing.internal(),
	}
	stopEvents, err := events.Serve()
	if err != nil {
		return fail(err)
	}
	stops.pushFunc(stopEvents)
	if w.cfg.ApplyAckWait {
		// Consumers whose AckWait is longer are lowered all together, in
		// one grace period (see LowerAckWait).
		if err := assets.LowerAckWait(ctx, consumers, w.cfg.AckWait, w.logConsumer); err != nil {
			return fail(err)
		}
	}
	// Announced once start requests are answered: a workflow recorded as
	// known has been served, and a live record means a worker answers.
	presence, err := roster.Announce(ctx, assets.Workflows, w.ws.Names(), w.cfg.Name, w.cfg.Build, w.cfg.LivenessTTL, w.log)
	if err != nil {
		return fail(err)
	}
	w.since = presence.Since()
	w.gate.newer.Store(nil)
	// The liveness records are withdrawn beside the rest of the stop,
	// which waits for it last.
	var withdrawn <-chan struct{}
	stops.push(func(ctx context.Context) error { withdrawn = w.withdraw(ctx, presence); return nil })
	// A worker of another engine protocol that joins later pauses this one.
	gateCtx, stopGate := context.WithCancel(context.Background())
	gateDone := make(chan struct{})
	go func() {
		defer close(gateDone)
		w.gate.watch(gateCtx, w, max(w.cfg.LivenessTTL/3, time.Second))
	}()
	stops.do(func() { stopGate(); <-gateDone; w.gate.paused.Store(false) })
	sampling, stopSampling := context.WithCancel(context.Background())
	stops.do(stopSampling)
	w.cfg.Metrics.internal().WatchBacklog(sampling, w.cfg.BacklogInterval, func(ctx context.Context) ([]metrics.Backlog, error) {
		return backlogs(ctx, consumers)
	})
	stops.do(startSweeper(sweeper))
	stops.do(guardSubjects(assets, subjectGuardEvery, w.log))
	// Envelopes for workflows no worker serves: a gauge and a warn log.
	stops.do(startproto.WatchUnserved(assets, w.cfg.BacklogInterval, w.cfg.Metrics.internal(), w.log))
	w.pool, w.started = pool, true
	w.serving.Store(&serving{assets: assets, consumers: consumers})
	w.stopServe = func(ctx context.Context) error {
		err := stops.unwind(ctx)
		<-withdrawn
		return err
	}
	w.log.Info().Strs("workflows", w.ws.Names()).Int("concurrency", w.cfg.Concurrency).Msg("worker started")
	return nil
}

// checkCode replays the worker's code against the runs in flight of its
// workflows (CheckBeforeServing): a *CodeCheckError when it would block
// some.
func (w *Worker) checkCode(ctx context.Context, assets *jetstream.Assets, eng engine) error {
	c := &Client{nc: w.nc, cfg: ClientConfig{Topology: w.cfg.Topology}.WithDefaults(), assets: assets, engine: eng}
	check, err := c.CheckCode(ctx, w.ws, w.cfg.Build)
	if err != nil {
		return fmt.Errorf("jetflow: check the code against the runs in flight: %w", err)
	}
	if !check.Clean() {
		return &CodeCheckError{Check: check}
	}
	w.log.Info().Int("runs", check.Checked).Str("build", w.cfg.Build).Msg("the worker's code replays every run in flight")
	return nil
}

// withdraw withdraws the worker's liveness records, beside the drain and
// for at most LivenessTTL (after which they have expired by themselves),
// and closes the returned channel when it is done. A refused or slow
// withdrawal is logged, not returned: the drain is what Stop reports, and
// a purge that hangs (a publish the server's permissions drop gets no
// answer) must not eat the drain's time.
func (w *Worker) withdraw(ctx context.Context, presence *roster.Presence) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(ctx, w.cfg.LivenessTTL)
		defer cancel()
		if err := presence.Stop(ctx); err != nil {
			w.log.Warn().Err(err).Str("expires_in", logging.Duration(w.cfg.LivenessTTL)).
				Msg("liveness records not withdrawn; they expire by themselves")
		}
	}()
	return done
}

// eventChecks are the event checks of the workflows w serves: each event
// a workflow declares (WithEvent), with its payload type's check.
func (w *Worker) eventChecks() map[string]eventproto.Check {
	checks := make(map[string]eventproto.Check, len(w.ws.defs))
	for name, wf := range w.ws.defs {
		declared := wf.declaredEvents()
		checks[name] = func(event string, payload json.RawMessage) error {
			et, ok := declared[event]
			if !ok {
				return fmt.Errorf("%w: workflow %s declares no event %q", ErrUnknownEvent, name, event)
			}
			return et.check(payload)
		}
	}
	return checks
}

// consumeLegacy binds the consumers of the executor before the lease that
// exist (its task consumers of w's workflows, its due-timer consumer) to
// the executor's adoption of their runs (workflow.Executor.Legacy), one
// delivery at a time each, logging at warn what waits on them. It creates
// and changes no consumer: they are that version's.
func (w *Worker) consumeLegacy(ctx context.Context, assets *jetstream.Assets, pool *consume.Pool, h consume.Handler) error {
	type named struct{ stream, name string }
	var legacy []named
	for name := range w.ws.defs {
		for _, c := range jetstream.LegacyConsumerNames(name) {
			legacy = append(legacy, named{jetstream.TasksStream, c})
		}
	}
	legacy = append(legacy, named{jetstream.TimersStream, jetstream.LegacyDueConsumer})
	for _, l := range legacy {
		c, err := assets.JS.Consumer(ctx, l.stream, l.name)
		if errors.Is(err, natsjs.ErrConsumerNotFound) || errors.Is(err, natsjs.ErrStreamNotFound) {
			continue // none: nothing of that version waits
		}
		if err != nil {
			// Not fatal: a deployment that never ran that executor may not
			// grant the look-up; one that did is told what is not read.
			w.log.Warn().Err(err).Str("consumer", l.name).Msg("cannot look up a consumer of the executor before the lease: runs it holds are not taken over by this worker")
			continue
		}
		if info := c.CachedInfo(); info.NumPending+uint64(info.NumAckPending) > 0 {
			w.log.Warn().Str("consumer", l.name).Uint64("pending", info.NumPending).Int("ack_pending", info.NumAckPending).
				Msg("runs of the executor before the lease have work waiting on this consumer: this worker takes them over as their messages come")
		}
		if err := pool.Consume(c, 1, h); err != nil {
			return fmt.Errorf("jetflow: consume %s: %w", l.name, err)
		}
	}
	return nil
}

// dueSlots is how many due timers a worker moves into the task stream at
// once.
const dueSlots = 4

// logConsumer reports a consumer, stream or bucket setting kept or changed
// at start-up.
func (w *Worker) logConsumer(msg string, kv ...any) {
	w.log.Warn().Fields(kv).Msg(msg)
}

// backlogs reads the consumers' infos: what waits to be delivered, and
// what is delivered but not yet acknowledged.
func backlogs(ctx context.Context, consumers []natsjs.Consumer) ([]metrics.Backlog, error) {
	out := make([]metrics.Backlog, 0, len(consumers))
	for _, c := range consumers {
		info, err := c.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("jetflow: consumer info: %w", err)
		}
		out = append(out, metrics.Backlog{Consumer: info.Name, Pending: info.NumPending, AckPending: uint64(info.NumAckPending)})
	}
	return out, nil
}

// Ready reports whether the worker can do its job: started and not
// stopping, connected to NATS, the engine's streams and buckets present and
// every consumer it executes tasks from still bound. A nil error means
// ready; otherwise the error says what is missing. It is what a readiness
// probe should call; it costs one JetStream request per consumer and two
// per bucket checked.
func (w *Worker) Ready(ctx context.Context) error {
	s := w.serving.Load()
	if s == nil {
		return errors.New("jetflow: worker not started, or stopping")
	}
	if err := w.gate.err(); err != nil {
		return err
	}
	return ready(ctx, w.nc, s.assets, s.consumers)
}

// ready checks the connection, the buckets runs and steps, and consumers.
func ready(ctx context.Context, nc *nats.Conn, assets *jetstream.Assets, consumers []natsjs.Consumer) error {
	if s := nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("jetflow: NATS connection is %s", s)
	}
	for _, kv := range []*jetstream.KV{assets.Runs, assets.Steps} {
		if _, err := kv.Raw().Status(ctx); err != nil {
			return fmt.Errorf("jetflow: bucket %s: %w", kv.Bucket(), err)
		}
	}
	if _, err := backlogs(ctx, consumers); err != nil {
		return err
	}
	return nil
}

// Stop stops taking new tasks and start requests (durable starts in
// progress are admitted or handed back), hands back tasks that were fetched
// but not started, and waits for running steps to finish, commit and
// be acknowledged. If ctx ends first, running steps see their context
// cancelled and their tasks are released uncommitted, for another worker to
// run again with the same step IDs. Stop returns ctx's error in that case;
// calling it again, or on a worker never started, returns nil. Stop also
// withdraws the worker's liveness records (WorkerConfig.LivenessTTL); one
// it cannot withdraw is logged at warn, not returned: it expires by
// itself.
func (w *Worker) Stop(ctx context.Context) error {
	w.draining.Store(true)
	w.serving.Store(nil) // not ready from now on, before waiting for mu
	w.mu.Lock()
	defer w.mu.Unlock()
	w.serving.Store(nil) // a Start that held mu meanwhile set it again
	if !w.started {
		return nil
	}
	w.started = false
	// The task pool stops pulling at once, alongside the rest: a pool that
	// still pulled while the others stop would take tasks only to hand
	// them back.
	pooled := make(chan error, 1)
	go func() { pooled <- w.pool.Stop(ctx) }()
	err := errors.Join(w.stopServe(ctx), <-pooled)
	w.log.Info().Err(err).Msg("worker stopped")
	return err
}

// randomSuffix tells apart the workers of one process. A NUID's first 12
// characters are a per-process prefix; its last ones change with every
// call.
func randomSuffix() string {
	id := nuid.Next()
	return id[len(id)-6:]
}

// stopStack is what a start-up set up, to undo in reverse order.
type stopStack []func(context.Context) error

// push adds stop, which undoes what was set up last.
func (s *stopStack) push(stop func(context.Context) error) { *s = append(*s, stop) }

// pushFunc adds a stop that needs no context.
func (s *stopStack) pushFunc(stop func() error) {
	s.push(func(context.Context) error { return stop() })
}

// do adds a stop that cannot fail.
func (s *stopStack) do(stop func()) {
	s.push(func(context.Context) error { stop(); return nil })
}

// unwind runs every stop, the last pushed first, and joins their errors.
// The stack is empty after it: a repeat call runs nothing.
func (s *stopStack) unwind(ctx context.Context) error {
	var errs []error
	for i := len(*s) - 1; i >= 0; i-- {
		errs = append(errs, (*s)[i](ctx))
	}
	*s = nil
	return errors.Join(errs...)
}

// vcsBuild is the build identity the Go toolchain stamped into the binary:
// the first 12 characters of its VCS revision, "+dirty" when the tree had
// changes; "" when it stamped none (go run, go test, -buildvcs=false).
func vcsBuild() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev[:min(12, len(rev))] + dirty
}
