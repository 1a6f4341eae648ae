package jetflow

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/internal/workflow"
)

// engine is what a worker and a client both start and cancel runs with:
// one run store, the one cancel path (workflow.Canceller) and the
// admitter, which finishes a superseding start's cancel through it.
type engine struct {
	runs    *runs.Store
	admit   *dedupe.Admitter
	cancels *workflow.Canceller
}

// newEngine assembles the engine over provisioned assets; a client's
// (viaWorkers) wakes a cancelled child's parent through a worker. The
// admitter logs to log.
func newEngine(assets *jetstream.Assets, m *metrics.Metrics, t *tracing.Tracer, log zerolog.Logger, viaWorkers bool) engine {
	store := runs.New(assets)
	cancels := workflow.NewCanceller(assets, store, m, t, viaWorkers)
	admit := dedupe.New(assets, dedupe.Config{Metrics: m, Tracer: t, Logger: log,
		Cancelled: func(ctx context.Context, run state.Run, first bool) error {
			_, err := cancels.Ended(ctx, run, first)
			return err
		}})
	return engine{runs: store, admit: admit, cancels: cancels}
}

// cancel cancels the run runID and its attached children (see
// Client.CancelRun).
func (e engine) cancel(ctx context.Context, runID string) (CancelOutcome, error) {
	c, err := e.cancels.Cancel(ctx, runID)
	if c.Run.RunID == "" {
		return CancelOutcome{}, err
	}
	return CancelOutcome{RunID: runID, Status: RunStatus(c.Run.Status), AlreadyCancelled: c.Already, Children: c.Children}, err
}
