package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// ErrRunCancelled is the cause of a step's and a body's context when their
// run is cancelled while they run.
var ErrRunCancelled = errors.New("jetflow: run cancelled")

// errRunNotRunning: a step is not started because its run's record says
// the run is no longer running (cancelled, ended, or replaced by a new
// generation) since its task was published.
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
// its run is; the returned func forgets d.
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
		if d.task.Token == token {
			cancel(ErrRunCancelled)
		}
	}
}

// MarkCancelled records that the run created with token was cancelled: its
// running steps and body see their context cancelled (cause
// ErrRunCancelled), and its further tasks on this worker are dropped.
func (e *Executor) MarkCancelled(runID, token string) {
	e.cancelled.add(runID, token)
	e.inflight.cancel(runID, token)
}

// cancelledRun reports whether d's context was cancelled because its run
// was.
func cancelledRun(d *delivery) bool {
	return errors.Is(context.Cause(d.ctx), ErrRunCancelled)
}

// stillRunning reads the run's record before a step of d starts and
// returns a drop settlement when the run is no longer running: cancelled,
// ended or replaced since d's task was published. This is what keeps a
// cancelled run from starting steps on a worker that missed the cancel
// notice. A start task read the record when it was received and reads it
// again only when recheck is set (it published other steps first).
func (e *Executor) stillRunning(d *delivery, recheck bool) *settlement {
	if d.task.StepID == "" && !recheck {
		return nil
	}
	return e.runCheck(d)
}

// checkRunning starts stillRunning's read for a step task's own step and
// returns where its answer comes (a nil settlement: the run still runs),
// so that the read goes out beside the step's own lookup.
func (e *Executor) checkRunning(d *delivery) <-chan *settlement {
	ch := make(chan *settlement, 1)
	go func() { ch <- e.runCheck(d) }()
	return ch
}

// runCheck reads the run's record and returns a drop settlement when the
// run is no longer running (see stillRunning), a release one when it
// cannot be read.
func (e *Executor) runCheck(d *delivery) *settlement {
	run, _, err := e.runs.Get(d.nctx, d.run.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: its record is gone", errRunNotRunning)}
	}
	if err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	if run.Token != d.run.Token || run.Generation != d.run.Generation {
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: the run ID holds another run now", errRunNotRunning)}
	}
	if run.Status != state.StatusRunning {
		if run.Status == state.StatusCancelled {
			e.cancelled.add(run.RunID, run.Token)
		}
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: it is %s", errRunNotRunning, run.Status)}
	}
	return nil
}
