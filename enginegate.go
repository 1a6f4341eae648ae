package jetflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/state"
)

// ErrEngineMismatch: workers of another engine protocol are running in the
// deployment (an earlier version's, during an upgrade), and a worker of
// this version executes nothing beside them: the two would run one run's
// steps each their own way. Stop them first (docs/operations.md,
// "Upgrading the engine"). The worker command waits, unready, until they are gone;
// Start returns it as an *EngineMismatchError.
var ErrEngineMismatch = errors.New("jetflow: workers of another engine protocol are running")

// EngineProtocol is the engine protocol this version speaks: what its
// workers put on the wire and in records. Workers record it in the
// deployment's roster (Roster shows it); 1 was the executor of step tasks,
// 2 the lease executor before blocked, pinned and patched runs.
const EngineProtocol = state.EngineProtocol

// EngineMismatchError names the live workers of other engine protocols that
// keep a worker of this version from executing anything.
type EngineMismatchError struct {
	// Workers are the live workers of another protocol: name, protocol
	// (0: a version before protocols were recorded), build.
	Workers []ForeignWorker
}

// ForeignWorker is a live worker of another engine protocol.
type ForeignWorker struct {
	Name     string `json:"name"`
	Protocol int    `json:"protocol"`
	Build    string `json:"build,omitempty"`
	// Beat is its latest heartbeat.
	Beat time.Time `json:"beat"`
}

func (e *EngineMismatchError) Error() string {
	names := make([]string, len(e.Workers))
	for i, w := range e.Workers {
		p := fmt.Sprintf("protocol %d", w.Protocol)
		if w.Protocol == 0 {
			p = "an earlier version"
		}
		names[i] = fmt.Sprintf("%s (%s)", w.Name, p)
	}
	return fmt.Sprintf("%s: %s; this worker speaks protocol %d and executes nothing beside them: stop them (docs/operations.md, Upgrading the engine)",
		ErrEngineMismatch, strings.Join(names, ", "), EngineProtocol)
}

func (e *EngineMismatchError) Unwrap() error { return ErrEngineMismatch }

// engineGate keeps a worker from executing tasks while a worker of another
// engine protocol is live: before its Start provisions anything (check), and
// while it runs (watch: a worker of an earlier version started after it).
type engineGate struct {
	log zerolog.Logger

	mu sync.Mutex
	kv *jetstream.KV // the roster bucket once bound

	// paused: a foreign worker is live; the executor hands tasks back.
	paused  atomic.Bool
	foreign atomic.Pointer[EngineMismatchError]
	// newer: per workflow, a worker of another build started serving it
	// after this one (superseded).
	newer atomic.Pointer[map[string]bool]
	// builds: per workflow, the builds of this protocol's live workers.
	builds atomic.Pointer[map[string]map[string]bool]
}

// foreignWorkers reads the roster and returns the live workers of another
// protocol; none when the deployment has no roster yet. It also notes, for
// each workflow, whether a worker of another build started serving it
// after w did (newer), and the builds its live workers run (builds).
func (g *engineGate) foreignWorkers(ctx context.Context, w *Worker) ([]ForeignWorker, error) {
	g.mu.Lock()
	kv := g.kv
	g.mu.Unlock()
	if kv == nil {
		var err error
		if kv, err = jetstream.LookupWorkflows(ctx, w.nc, w.cfg.Topology); err != nil || kv == nil {
			return nil, err
		}
		g.mu.Lock()
		g.kv = kv
		g.mu.Unlock()
	}
	live, err := roster.Current(ctx, kv, time.Now())
	if err != nil {
		return nil, err
	}
	newer := map[string]bool{}
	builds := map[string]map[string]bool{}
	var out []ForeignWorker
	for _, l := range live {
		if l.Protocol == EngineProtocol {
			if l.Build != w.cfg.Build && l.Since.After(w.since) {
				newer[l.Workflow] = true
			}
			if builds[l.Workflow] == nil {
				builds[l.Workflow] = map[string]bool{}
			}
			builds[l.Workflow][l.Build] = true
			continue
		}
		fw := ForeignWorker{Name: l.Worker, Protocol: l.Protocol, Build: l.Build, Beat: l.Beat}
		if !slices.ContainsFunc(out, func(o ForeignWorker) bool { return o.Name == fw.Name }) {
			out = append(out, fw)
		}
	}
	g.newer.Store(&newer)
	g.builds.Store(&builds)
	return out, nil
}

// buildLive reports whether a live worker of this protocol and of build
// served workflow at the roster's last read.
func (g *engineGate) buildLive(workflow, build string) bool {
	m := g.builds.Load()
	return m != nil && (*m)[workflow][build]
}

// superseded reports whether a worker of another build started serving
// workflow after this one, as the roster said at its last read: this
// worker then starts no new run of a pinned workflow (a run pinned to the
// newest build is taken by its workers) and serves the runs pinned to its
// own build until they end.
func (g *engineGate) superseded(workflow string) bool {
	m := g.newer.Load()
	return m != nil && (*m)[workflow]
}

// check fails with an *EngineMismatchError when a worker of another
// protocol is live; a roster that cannot be read is an error too (the
// worker command tries again).
func (g *engineGate) check(ctx context.Context, w *Worker) error {
	fw, err := g.foreignWorkers(ctx, w)
	if err != nil {
		return fmt.Errorf("jetflow: read the deployment's workers: %w", err)
	}
	if len(fw) > 0 {
		return &EngineMismatchError{Workers: fw}
	}
	return nil
}

// watch looks at the roster every period until ctx ends: while a worker of
// another protocol is live it pauses the worker (the executor hands every
// task back, holders hand their runs over at the next step boundary, and
// Ready fails), logging at error level; when none is left it resumes.
func (g *engineGate) watch(ctx context.Context, w *Worker, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, period)
		fw, err := g.foreignWorkers(rctx, w)
		cancel()
		switch {
		case err != nil:
			if ctx.Err() == nil {
				g.log.Warn().Err(err).Msg("cannot read the deployment's workers for their engine protocol; trying again")
			}
		case len(fw) > 0:
			e := &EngineMismatchError{Workers: fw}
			g.foreign.Store(e)
			if !g.paused.Swap(true) {
				g.log.Error().Err(e).Msg("a worker of another engine protocol joined: this worker executes nothing until it leaves")
			}
		case g.paused.Swap(false):
			g.foreign.Store(nil)
			g.log.Warn().Msg("no worker of another engine protocol is left: executing again")
		}
	}
}

// err is why the worker is paused, or nil.
func (g *engineGate) err() error {
	if !g.paused.Load() {
		return nil
	}
	if e := g.foreign.Load(); e != nil {
		return e
	}
	return ErrEngineMismatch
}
