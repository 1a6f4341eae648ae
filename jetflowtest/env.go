package jetflowtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/kit"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/workflow"
)

// Config configures an Env. Zero fields take the defaults.
type Config struct {
	// AckWait is the workers' AckWait (default 2s): how long after a
	// simulated crash the crashed worker's task is redelivered to the
	// fresh worker. Running steps extend it every third, so a longer step
	// is not redelivered while its worker lives.
	AckWait time.Duration
	// Timeout bounds each wait of the Env: Run, Wait and the drain of the
	// workers at the end of the test (default 30s plus ten AckWaits).
	Timeout time.Duration
	// Worker is the base configuration of every worker the Env starts.
	// Its AckWait and Name are the Env's; a zero Logger writes warnings
	// and errors to the test's log.
	Worker jetflow.WorkerConfig
	// Client configures the Env's client.
	Client jetflow.ClientConfig
}

func (c Config) withDefaults() Config {
	if c.AckWait == 0 {
		c.AckWait = 2 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 30*time.Second + 10*c.AckWait
	}
	c.Client.Topology = c.Worker.Topology
	return c
}

// Env is one test's jetflow: an embedded NATS server with JetStream in
// t.TempDir(), a worker serving the test's workflows, and a client. It is
// stopped when the test ends, and the test fails if a worker does not
// drain in time or a connection the Env opened is left open.
//
// An Env is safe for concurrent use by the test's goroutines.
type Env struct {
	t      T
	cfg    Config
	srv    *natsserver.Server
	wfs    []jetflow.Registrable
	nc     *nats.Conn
	client *jetflow.Client
	clock  *Clock

	mu      sync.Mutex
	worker  *proc
	seq     int
	crashes int
	// replaced counts the crashed workers whose fresh worker has started.
	replaced int
	// changed is closed, and replaced by a new channel, when crashes or
	// replaced change.
	changed chan struct{}
	// points are the armed crash points, by step name.
	points map[string]*crashPoint
	// stubs replace step functions, by workflow and step name ("" for
	// any workflow).
	stubs map[stubKey]workflow.StepFunc
	// reaping are the crashed workers being stopped.
	reaping sync.WaitGroup
	closed  bool
}

// New starts an Env serving wfs with the default Config. See NewWithConfig.
func New(t T, wfs ...jetflow.Registrable) *Env {
	t.Helper()
	return NewWithConfig(t, Config{}, wfs...)
}

// NewWithConfig starts an embedded NATS server in t.TempDir(), a worker
// serving wfs and a client, and registers their shutdown with t.Cleanup.
// It fails the test at once when any of them cannot start, and before that
// when a workflow's body misuses jetflow on its way through a run that
// commits nothing (DryRun: a wait for an undeclared event, a step from a
// goroutine of its own, steps never awaited).
func NewWithConfig(t T, cfg Config, wfs ...jetflow.Registrable) *Env {
	t.Helper()
	cfg = cfg.withDefaults()
	for _, wf := range wfs {
		if err := DryRun(wf); err != nil {
			t.Fatalf("%v", err)
		}
	}
	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatalf("jetflowtest: start embedded NATS: %v", err)
	}
	e := &Env{t: t, cfg: cfg, srv: srv, wfs: wfs, clock: newClock(), changed: make(chan struct{}),
		points: map[string]*crashPoint{}, stubs: map[stubKey]workflow.StepFunc{}}
	t.Cleanup(e.close)
	if e.nc, err = jetstream.Connect(srv.ClientURL(), t.Name()+"-client"); err != nil {
		t.Fatalf("jetflowtest: connect: %v", err)
	}
	if err := e.startWorker(); err != nil {
		t.Fatalf("jetflowtest: %v", err)
	}
	ctx, cancel := e.context()
	defer cancel()
	if e.client, err = jetflow.NewClient(ctx, e.nc, cfg.Client); err != nil {
		t.Fatalf("jetflowtest: client: %v", err)
	}
	return e
}

// Client is the Env's client, for starting runs and reading them.
func (e *Env) Client() *jetflow.Client { return e.client }

// Conn is the client's NATS connection.
func (e *Env) Conn() *nats.Conn { return e.nc }

// URL is the embedded server's client URL, for a second client or a
// process under test.
func (e *Env) URL() string { return e.srv.ClientURL() }

// Crashes is how many worker crashes the Env has simulated.
func (e *Env) Crashes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.crashes
}

// AwaitCrashes waits, within the Env's Timeout, until n crashes have
// happened and the fresh worker that replaces each has started, and fails
// the test otherwise. Call it before a request that a worker answers
// (Client.SendEvent, StartByName) and that must not reach the worker being
// crashed: a request that a worker receives and dies before answering is
// not answered, and waits for its context to end.
func (e *Env) AwaitCrashes(n int) {
	e.t.Helper()
	timeout := time.NewTimer(e.cfg.Timeout)
	defer timeout.Stop()
	for {
		e.mu.Lock()
		crashes, replaced, changed := e.crashes, e.replaced, e.changed
		e.mu.Unlock()
		if crashes >= n && replaced >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout.C:
			e.t.Fatalf("jetflowtest: %d crash(es) and %d fresh worker(s) within %s, want %d", crashes, replaced, e.cfg.Timeout, n)
		}
	}
}

// noteChange wakes AwaitCrashes; e.mu is held.
func (e *Env) noteChange() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// context is bounded by the Env's Timeout.
func (e *Env) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), e.cfg.Timeout)
}

// startWorker starts a fresh worker, on a connection of its own, and makes
// it the current one.
func (e *Env) startWorker() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.seq++
	p := &proc{name: fmt.Sprintf("%s-worker-%d", sanitize(e.t.Name()), e.seq)}
	e.mu.Unlock()

	if err := p.dial(e.srv.ClientURL()); err != nil {
		return fmt.Errorf("connect worker: %w", err)
	}
	nc := p.nc
	reg := jetflow.NewRegistry()
	if err := reg.Register(e.wfs...); err != nil {
		nc.Close()
		return err
	}
	wc := e.cfg.Worker
	wc.Name, wc.AckWait = p.name, e.cfg.AckWait
	if wc.Logger.GetLevel() == zerolog.DebugLevel { // the zero Logger
		p.log = &silencer{w: zerolog.NewTestWriter(e.t)}
		wc.Logger = zerolog.New(p.log).Level(zerolog.WarnLevel)
	}
	wc.Kit = &kit.WorkerOptions{Hooks: e.hooks(p), Now: e.clock.Now, Schedule: e.clock.schedule}
	w, err := jetflow.NewWorker(nc, reg, wc)
	if err != nil {
		nc.Close()
		return err
	}
	p.w = w // before Start: a crash hook may fire as soon as it consumes
	ctx, cancel := e.context()
	defer cancel()
	if err := w.Start(ctx); err != nil {
		nc.Close()
		return fmt.Errorf("start worker: %w", err)
	}
	e.mu.Lock()
	e.worker = p
	e.mu.Unlock()
	return nil
}

// hooks are the fault and stub hooks of worker p.
func (e *Env) hooks(p *proc) workflow.Hooks {
	return workflow.Hooks{
		AfterCommit: func(stepID string, won bool) {
			if won && e.take(stepName(stepID), afterCommit) {
				e.crash(p)
			}
		},
		WrapStep: func(wf, step string, fn workflow.StepFunc) workflow.StepFunc {
			if stub := e.stub(wf, step); stub != nil {
				fn = stub
			}
			if e.armed(step, duringStep) {
				fn = e.crashDuring(p, step, fn)
			}
			return func(ctx context.Context) (json.RawMessage, error) {
				return fn(withProc(ctx, p)) // Effects ignores what a killed worker's steps still do
			}
		},
	}
}

// stepName is the step name in a step ID: <run identity>.<name>.<n>, where
// names hold no '.'.
func stepName(stepID string) string {
	rest := stepID[:max(strings.LastIndexByte(stepID, '.'), 0)]
	return rest[strings.LastIndexByte(rest, '.')+1:]
}

// sanitize makes a test name usable in a worker name.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, name)
}

// close waits for crashed workers to be reaped and a restart under way to
// finish, stops the current worker within the Timeout, closes the client
// and checks that no connection the Env opened was left open.
func (e *Env) close() {
	e.mu.Lock()
	e.closed = true // no worker starts after this
	e.mu.Unlock()
	e.reaping.Wait() // crashed workers stopped, a restart under way finished
	e.mu.Lock()
	p := e.worker
	e.mu.Unlock()
	if p != nil && p.w != nil {
		ctx, cancel := e.context()
		if err := p.w.Stop(ctx); err != nil {
			e.t.Errorf("jetflowtest: worker did not drain: %v", err)
		}
		cancel()
		p.nc.Close()
		p.log.off() // goroutines that ignored the drain's cancellation may still log
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if n := e.waitClients(); n != 0 {
		e.t.Errorf("jetflowtest: %d NATS connection(s) still open at the end of the test", n)
	}
	e.srv.Shutdown()
}

// waitClients waits, within the Timeout, for the server to see every
// connection closed, and returns how many are still open.
func (e *Env) waitClients() int {
	deadline := time.Now().Add(e.cfg.Timeout)
	for {
		n := e.srv.Clients()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}
