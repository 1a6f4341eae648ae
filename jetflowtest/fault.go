package jetflowtest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jetflow/jetflow/internal/workflow"
)

// crashKind is where a crash point crashes its worker.
type crashKind int

const (
	// afterCommit: the step's result is committed, its task not yet
	// acknowledged and the next step's task not yet published.
	afterCommit crashKind = iota
	// duringStep: the step's function has run (its side effect happened),
	// its result is not committed.
	duringStep
)

// crashPoint is an armed crash: it fires times more times.
type crashPoint struct {
	kind  crashKind
	times int
}

// CrashAfterCommit arms a simulated crash of the worker at the next commit
// of a step called step (of any run): the worker dies after the step's
// result is committed and before its task is acknowledged or the next
// step's task is published, the window in which a naive engine runs a
// step twice. A fresh worker takes over at once, as a supervisor restarts
// a killed process, and receives the task again after AckWait.
//
// What the run must show afterwards: the step's function ran once, and the
// run completes.
func (e *Env) CrashAfterCommit(step string) { e.arm(step, afterCommit) }

// CrashDuringStep arms a simulated crash of the worker in the middle of the
// next call of a step called step: its function runs (its side effect
// happens), then the worker dies before the result is committed. A fresh
// worker takes over at once and runs the step again after AckWait, under
// the same step ID, which is the Idempotency-Key an external API
// deduplicates the repeated call with (see Effects).
func (e *Env) CrashDuringStep(step string) { e.arm(step, duringStep) }

func (e *Env) arm(step string, kind crashKind) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.points[step]; ok && p.kind == kind {
		p.times++
		return
	}
	e.points[step] = &crashPoint{kind: kind, times: 1}
}

// armed reports whether a crash point of kind is armed at step.
func (e *Env) armed(step string, kind crashKind) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.points[step]
	return ok && p.kind == kind && p.times > 0
}

// take uses up one firing of the crash point of kind at step, if armed.
func (e *Env) take(step string, kind crashKind) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.points[step]
	if !ok || p.kind != kind || p.times == 0 {
		return false
	}
	if p.times--; p.times == 0 {
		delete(e.points, step)
	}
	return true
}

// crashDuring wraps fn so that its call crashes worker p once fn returned:
// the call's context is then cancelled (the worker is stopping) and its
// result never committed.
func (e *Env) crashDuring(p *proc, step string, fn workflow.StepFunc) workflow.StepFunc {
	return func(ctx context.Context) (json.RawMessage, error) {
		out, err := fn(ctx)
		if !e.take(step, duringStep) {
			return out, err
		}
		e.crash(p)
		<-ctx.Done() // a dead process returns nothing
		return nil, fmt.Errorf("jetflowtest: worker %s crashed in step %s: %w", p.name, step, ctx.Err())
	}
}

// crash kills worker p as a SIGKILL would: its sockets are closed at once,
// so nothing it would still send (a commit, a publish, an ack, a heartbeat,
// even one already buffered) reaches the server, and a fresh worker is
// started in its place. A second crash of p does nothing; a crash while the
// Env stops starts no worker.
func (e *Env) crash(p *proc) {
	if !p.kill() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.crashes++
	e.noteChange()
	if e.closed {
		return // the Env stops p with the others
	}
	e.reaping.Add(2)
	go func() {
		defer e.reaping.Done()
		// Reap the dead worker's goroutines: every call it makes fails on
		// the closed connection, and its steps' contexts are cancelled at
		// once. A step function that ignores its context runs on, as
		// nothing stops it in a test process; Effects ignores its calls.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.w.Stop(ctx) // it crashed: its drain has nothing to report
	}()
	go func() {
		defer e.reaping.Done()
		if err := e.startWorker(); err != nil {
			e.t.Errorf("jetflowtest: restart the worker after a crash: %v", err)
			return
		}
		e.mu.Lock()
		e.replaced++
		e.noteChange()
		e.mu.Unlock()
	}()
}
