package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// Canceller ends runs as cancelled. It is the one cancel path: a client's
// cancel (Client.CancelRun), a superseding start that cancels the running
// generation (dedupe.Config.Cancelled), the executor cancelling a
// cancelled parent's children, and the executor finishing a cancel whose
// canceller stopped half way (Config.Cancel) all go through it, so each
// cancel does the same things in the same order: write the record
// cancelled (its lease revoked first, runs.Store.Cancel), count the run's
// end and end its span once, tell the parent, publish and flush the
// workers' notice, cancel the attached children. Every step is safe to
// repeat. It is safe for concurrent use.
type Canceller struct {
	nc      *nats.Conn
	runs    *runs.Store
	parents ParentNotifier
	metrics *metrics.Metrics
	tracer  *tracing.Tracer
}

// NewCanceller returns the canceller of a worker, or of a client
// (viaWorkers): a client wakes a cancelled child's parent through a
// worker (ParentNotifier.ViaBranch). m and t may be nil.
func NewCanceller(assets *jetstream.Assets, store *runs.Store, m *metrics.Metrics, t *tracing.Tracer, viaWorkers bool) *Canceller {
	return &Canceller{nc: assets.JS.Conn(), runs: store, metrics: m, tracer: t,
		parents: ParentNotifier{Assets: assets, Runs: store, Now: time.Now, ViaBranch: viaWorkers}}
}

// flushTimeout bounds the flush of a cancel notice when the caller's
// context has no earlier deadline.
const flushTimeout = 10 * time.Second

// Cancelled is what Cancel did.
type Cancelled struct {
	// Run is the run's record after the call.
	Run state.Run
	// Already is set when the run was cancelled before this call.
	Already bool
	// Children are the attached child runs cancelled with it (by this
	// call or the one it repeats), grandchildren included.
	Children []string
}

// Cancel cancels the run runID and its attached children. A run that has
// no record is an error matching ErrRunNotFound; one that ended otherwise
// first, ErrRunEnded (with Run set). A repeat call finds the run
// cancelled (Already) and tells the parent, the workers and the children
// again: the call that cancelled it may have failed to.
func (x *Canceller) Cancel(ctx context.Context, runID string) (Cancelled, error) {
	run, cancelled, err := x.runs.Cancel(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return Cancelled{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return Cancelled{}, err
	}
	out := Cancelled{Run: run, Already: !cancelled}
	if run.Status != state.StatusCancelled {
		return out, fmt.Errorf("%w: %s is %s", ErrRunEnded, runID, run.Status)
	}
	out.Children, err = x.Ended(ctx, run, cancelled)
	return out, err
}

// Finish finishes the cancel of run runID that its canceller began (its
// lease moved) and may not have ended. A run that ended meanwhile, or has
// no record, is left as it is.
func (x *Canceller) Finish(ctx context.Context, runID string) error {
	_, err := x.Cancel(ctx, runID)
	if errors.Is(err, ErrRunEnded) || errors.Is(err, ErrRunNotFound) {
		return nil
	}
	return err
}

// Ended tells the parent and the workers of run, which has just been
// written cancelled (by this process when first), and cancels its
// attached children, their children included; it returns the children it
// cancelled. first counts the run's end in the metrics and ends its span,
// once. The workers' notice is best effort as a delivery (a worker that
// misses it still starts no step of the run: every step reads the run's
// record or lease first), but its publish is flushed, so a failure to
// send it is an error.
func (x *Canceller) Ended(ctx context.Context, run state.Run, first bool) ([]string, error) {
	if first {
		x.metrics.RunFinished(run.Workflow, string(run.Status), run.UpdatedAt.Sub(run.CreatedAt))
		x.tracer.EndRun(run) // the run ends here, not in a worker
	}
	// The parent goes on with the child's failure as its step's result;
	// a parent cancelled itself gets the result recorded and no task.
	if err := x.parents.Notify(ctx, run); err != nil {
		return nil, fmt.Errorf("jetflow: run %s cancelled, but telling its parent failed: %w", run.RunID, err)
	}
	if err := x.nc.Publish(jetstream.CancelSubjectPrefix+run.RunID, []byte(run.Token)); err != nil {
		return nil, fmt.Errorf("jetflow: run %s cancelled, but notifying workers failed: %w", run.RunID, err)
	}
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := x.nc.FlushWithContext(fctx); err != nil {
		return nil, fmt.Errorf("jetflow: run %s cancelled, but notifying workers failed: %w", run.RunID, err)
	}
	var children []string
	for _, child := range run.Children {
		if child.Detached {
			continue
		}
		sub, err := x.Cancel(ctx, child.RunID)
		switch {
		case errors.Is(err, ErrRunNotFound) || errors.Is(err, ErrRunEnded):
			continue // never started (the parent's step was cut short), or ended first
		case err != nil:
			return children, fmt.Errorf("jetflow: run %s cancelled, but its child %s: %w", run.RunID, child.RunID, err)
		}
		children = append(children, child.RunID)
		children = append(children, sub.Children...)
	}
	return children, nil
}
