package workflow

import (
	"context"
	"errors"
	"sync"
)

// ErrRunCancelled is the cause of a step's and a body's context when their
// run is cancelled while they run.
var ErrRunCancelled = errors.New("jetflow: run cancelled")

// errRunNotRunning: a task of a run whose record says it is no longer
// running (cancelled, ended, or replaced by a new generation).
var errRunNotRunning = errors.New("jetflow: run is no longer running")

// inflight are the deliveries being handled, by run ID, so that a cancel
// notice cancels the context of their steps and bodies.
type inflight struct {
	mu   sync.Mutex
	runs map[string]map[*delivery]context.CancelCauseFunc
}

func newInflight() *inflight {
	return &inflight{runs: make(map[string]map[*delivery]context.CancelCauseFunc)}
}

// track gives d a context of its own, cancelled with ErrRunCancelled when
// its run is (or with the cause cancelOne is given); the returned func
// forgets d.
func (f *inflight) track(d *delivery, parent context.Context) (untrack func()) {
	ctx, cancel := context.WithCancelCause(parent)
	d.ctx = ctx
	f.mu.Lock()
	m := f.runs[d.task.RunID]
	if m == nil {
		m = make(map[*delivery]context.CancelCauseFunc, 1)
		f.runs[d.task.RunID] = m
	}
	m[d] = cancel
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if cur := f.runs[d.task.RunID]; cur != nil {
			delete(cur, d)
			if len(cur) == 0 {
				delete(f.runs, d.task.RunID)
			}
		}
		f.mu.Unlock()
		cancel(nil)
	}
}

// cancel cancels the contexts of the deliveries of run runID created with
// token.
func (f *inflight) cancel(runID, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for d, cancel := range f.runs[runID] {
		if d.run.Token == token {
			cancel(ErrRunCancelled)
		}
	}
}

// cancelOne cancels d's context with cause.
func (f *inflight) cancelOne(d *delivery, cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cancel, ok := f.runs[d.task.RunID][d]; ok {
		cancel(cause)
	}
}

// MarkCancelled tells the executor that the run created with token was
// cancelled: its running steps and body see their context cancelled
// (cause ErrRunCancelled). The notice is best effort: a holder that misses
// it finds its next commit refused (the cancel moved the run's lease), and
// every delivery reads the run's record first.
func (e *Executor) MarkCancelled(runID, token string) {
	e.inflight.cancel(runID, token)
}
