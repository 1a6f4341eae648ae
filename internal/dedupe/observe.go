package dedupe

import (
	"errors"

	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/jetflowtype"
)

// observe counts one start decision: its outcome (outcomeName) by entry
// point and, for a duplicate, the layer that stopped it: the runs bucket
// (a duplicate publishes nothing, so the broker's message-ID window never
// stops one).
func (a *Admitter) observe(entry, workflow, outcome string, res Result) {
	if a.metrics == nil {
		return
	}
	if entry == "" {
		entry = string(metrics.EntrySDK)
	}
	st := string(res.Run.Status)
	if st == "" {
		st = "none"
	}
	a.metrics.Start(metrics.Entry(entry), workflow, outcome, st)
	switch outcome {
	case metrics.OutcomeExisting, metrics.OutcomeConflict, metrics.OutcomeRejected:
		a.metrics.Suppressed(metrics.LayerKV)
	}
}

// outcomeName names what a start did, for its metric and its span:
// created, existing, restarted, superseded, conflict, rejected, invalid
// (invalid: the request itself was refused, the caller's mistake) or
// error (anything else: the engine could not decide).
func outcomeName(res Result, err error, invalid bool) string {
	switch {
	case err == nil:
		return res.Outcome.String()
	case errors.Is(err, jetflowtype.ErrIdempotencyConflict):
		return metrics.OutcomeConflict
	case errors.Is(err, jetflowtype.ErrDuplicateRejected):
		return metrics.OutcomeRejected
	case invalid:
		return metrics.OutcomeInvalid
	default:
		return metrics.OutcomeError
	}
}

// ObserveRefusal counts a start of workflow (one this process serves)
// refused before admission for the caller's mistake (a malformed envelope,
// a missing or invalid run ID, an input the workflow refuses) as invalid,
// apart from the engine's failures (error).
func (a *Admitter) ObserveRefusal(entry, workflow string) {
	a.metrics.Start(metrics.Entry(entry), workflow, metrics.OutcomeInvalid, "none")
}
