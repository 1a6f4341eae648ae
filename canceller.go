package jetflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/internal/workflow"
)

// canceller ends runs as cancelled, for CancelRun and for the superseding
// starts of the admitter: the record is written cancelled first, then the
// workers, the parent and the children are told.
type canceller struct {
	nc      *nats.Conn
	runs    *runs.Store
	parents workflow.ParentNotifier
	metrics *metrics.Metrics
	tracer  *tracing.Tracer
}

// newCanceller returns the canceller of a worker, or of a client
// (viaWorkers): a client wakes a cancelled child's parent through a
// worker (workflow.ParentNotifier.ViaBranch).
func newCanceller(nc *nats.Conn, assets *jetstream.Assets, store *runs.Store, m *metrics.Metrics, t *tracing.Tracer, viaWorkers bool) *canceller {
	return &canceller{nc: nc, runs: store, metrics: m, tracer: t,
		parents: workflow.ParentNotifier{Assets: assets, Runs: store, Now: time.Now, ViaBranch: viaWorkers}}
}

// attach makes a's superseding starts finish their cancels through x.
func (x *canceller) attach(a *dedupe.Admitter) {
	a.SetCancelled(func(ctx context.Context, run state.Run, first bool) error {
		_, err := x.ended(ctx, run, first)
		return err
	})
}

// finish finishes the cancel of run runID that its canceller began (its
// lease moved) and may not have ended: for the executor (see
// workflow.Config.Cancel). A run that ended meanwhile is left as it is.
func (x *canceller) finish(ctx context.Context, runID string) error {
	_, err := x.cancel(ctx, runID)
	if errors.Is(err, ErrRunEnded) || errors.Is(err, ErrRunNotFound) {
		return nil
	}
	return err
}

// cancel cancels the run runID and its attached children (see
// Client.CancelRun).
func (x *canceller) cancel(ctx context.Context, runID string) (CancelOutcome, error) {
	run, cancelled, err := x.runs.Cancel(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return CancelOutcome{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return CancelOutcome{}, err
	}
	out := CancelOutcome{RunID: runID, Status: RunStatus(run.Status), AlreadyCancelled: !cancelled}
	if run.Status != state.StatusCancelled {
		return out, fmt.Errorf("%w: %s is %s", ErrRunEnded, runID, run.Status)
	}
	// Again on a repeat: the call that cancelled the run may have failed
	// to tell the workers, the parent or the children (all safe to repeat).
	out.Children, err = x.ended(ctx, run, cancelled)
	return out, err
}

// ended tells the workers and the parent of run, which has just been
// written cancelled (by this process when first), and cancels its attached
// children, their children included; it returns the children it
// cancelled. first counts the run's end in the metrics and ends its span,
// once. Every step is safe to repeat. The workers' notice is best effort:
// a worker that misses it still starts no step of the run, as every step
// reads the run's record first.
func (x *canceller) ended(ctx context.Context, run state.Run, first bool) ([]string, error) {
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
	if err := x.nc.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("jetflow: run %s cancelled, but notifying workers failed: %w", run.RunID, err)
	}
	var children []string
	for _, child := range run.Children {
		if child.Detached {
			continue
		}
		sub, err := x.cancel(ctx, child.RunID)
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
