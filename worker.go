package jetflow

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/workflow"
)

// WorkerConfig configures a Worker. Zero fields take the defaults.
type WorkerConfig struct {
	// Name identifies the worker in logs and step records (default
	// hostname-pid-random).
	Name string
	// Concurrency is how many tasks (steps) run at once (default 64).
	Concurrency int
	// AckWait is how long the broker waits for a task's acknowledgement
	// before redelivering it to another worker (default 30s). Running steps
	// extend it every AckWait/3, so it bounds how fast a crashed worker's
	// step is picked up again, not how long a step may run.
	AckWait time.Duration
	// Topology must match the clients'.
	Topology Topology
	// Logger receives structured logs; the default discards them.
	Logger zerolog.Logger

	// hooks inject faults in tests.
	hooks workflow.Hooks
}

// WithDefaults fills unset fields.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), nuid.Next()[:6])
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	return c
}

func (c WorkerConfig) validate() error {
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("jetflow: worker config: Concurrency must be at least 1, got %d", c.Concurrency)
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("jetflow: worker config: AckWait must be at least 100ms, got %s", c.AckWait)
	}
	return nil
}

// Worker executes the runs of the workflows in its registry. Run as many
// workers as you like against one NATS deployment: they share each
// workflow's durable consumer.
type Worker struct {
	nc   *nats.Conn
	ws   *Workers
	cfg  WorkerConfig
	log  zerolog.Logger
	pool *consume.Pool

	mu        sync.Mutex
	started   bool
	stopServe func(context.Context) error
}

// NewWorker returns a worker for the workflows in ws. It does not touch NATS
// until Start.
func NewWorker(nc *nats.Conn, ws *Workers, cfg WorkerConfig) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(ws.defs) == 0 {
		return nil, errors.New("jetflow: worker has no workflows registered")
	}
	return &Worker{nc: nc, ws: ws, cfg: cfg, log: cfg.Logger.With().Str("worker", cfg.Name).Logger()}, nil
}

// Start provisions the engine's streams and buckets and each workflow's
// consumers (idempotently), then starts executing tasks, answering start
// requests and admitting durable starts. A second call fails.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("jetflow: worker already started")
	}
	assets, err := jetstream.Provision(ctx, w.nc, w.cfg.Topology, jetstream.CreateOrUpdate)
	if err != nil {
		return err
	}
	admit := dedupe.New(assets, nil)
	defs := make(map[string]workflow.Definition, len(w.ws.defs))
	served := make(map[string]dedupe.Served, len(w.ws.defs))
	for name, wf := range w.ws.defs {
		defs[name] = wf.definition()
		served[name] = wf.served()
	}
	exec := workflow.NewExecutor(workflow.Config{
		Assets: assets, Admitter: admit, Definitions: defs, Logger: w.log,
		WorkerID: w.cfg.Name, Hooks: w.cfg.hooks,
	})
	pool := consume.New(w.cfg.Concurrency, w.cfg.hooks.NoHeartbeat, w.log)
	cc := jetstream.ConsumerConfig{AckWait: w.cfg.AckWait, MaxAckPending: 64 * w.cfg.Concurrency}
	for name := range defs {
		// Runs in progress come first: start tasks get at most a quarter of
		// the slots, so a burst of starts cannot starve their later steps.
		for kind, limit := range map[jetstream.TaskKind]int{
			jetstream.StepTasks:  w.cfg.Concurrency,
			jetstream.StartTasks: max(1, w.cfg.Concurrency/4),
		} {
			c, err := assets.EnsureConsumer(ctx, name, kind, cc)
			if err != nil {
				return errors.Join(err, pool.Stop(ctx))
			}
			if err := pool.Consume(c, limit, exec); err != nil {
				return errors.Join(fmt.Errorf("jetflow: consume %s: %w", name, err), pool.Stop(ctx))
			}
		}
	}
	cancels, err := w.nc.Subscribe(CancelSubjectPrefix+"*", func(m *nats.Msg) {
		exec.MarkCancelled(strings.TrimPrefix(m.Subject, CancelSubjectPrefix), string(m.Data))
	})
	if err != nil {
		return errors.Join(fmt.Errorf("jetflow: subscribe to cancellations: %w", err), pool.Stop(ctx))
	}
	// Durable starts (jetflow.start.<workflow>): a few at a time per
	// workflow, admitted like every other start.
	stopDurable, err := dedupe.ServeDurable(ctx, assets, admit, served, dedupe.DurableConfig{
		AckWait: w.cfg.AckWait, Concurrency: min(4, w.cfg.Concurrency),
	}, w.log)
	if err != nil {
		return errors.Join(err, cancels.Unsubscribe(), pool.Stop(ctx))
	}
	stop, err := dedupe.Serve(w.nc, admit, served, 10*time.Second, w.log)
	if err != nil {
		return errors.Join(err, cancels.Unsubscribe(), stopDurable(ctx), pool.Stop(ctx))
	}
	w.pool, w.started = pool, true
	w.stopServe = func(ctx context.Context) error {
		return errors.Join(cancels.Unsubscribe(), stop(), stopDurable(ctx))
	}
	w.log.Info().Strs("workflows", w.ws.Names()).Int("concurrency", w.cfg.Concurrency).Msg("worker started")
	return nil
}

// Stop stops taking new tasks and start requests (durable starts in
// progress are admitted or handed back), hands back tasks that were fetched
// but not started, and waits for running steps to finish, commit and
// be acknowledged. If ctx ends first, running steps see their context
// cancelled and their tasks are released uncommitted, for another worker to
// run again with the same step IDs. Stop returns ctx's error in that case;
// calling it again, or on a worker never started, returns nil.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started {
		return nil
	}
	w.started = false
	err := errors.Join(w.stopServe(ctx), w.pool.Stop(ctx))
	w.log.Info().Err(err).Msg("worker stopped")
	return err
}
