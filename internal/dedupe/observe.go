package dedupe

import (
	"errors"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
)

// observe counts one start decision: its outcome by entry point and, for
// a duplicate, the layer that stopped it first (the broker's message-ID
// window or pending task, else the runs bucket).
func (a *Admitter) observe(entry, workflow string, res Result, err error) {
	if a.metrics == nil {
		return
	}
	if entry == "" {
		entry = string(metrics.EntrySDK)
	}
	outcome := outcomeName(res, err)
	st := string(res.Run.Status)
	if st == "" {
		st = "none"
	}
	a.metrics.Start(metrics.Entry(entry), workflow, outcome, st)
	switch outcome {
	case "existing", "conflict", "rejected":
		if res.Broker != jetstream.Stored {
			a.metrics.Suppressed(metrics.LayerBroker)
		} else {
			a.metrics.Suppressed(metrics.LayerKV)
		}
	}
}

// outcomeName names what a start did, for its metric and its span:
// created, existing, restarted, superseded, conflict, rejected or error.
func outcomeName(res Result, err error) string {
	switch {
	case err == nil:
		return res.Outcome.String()
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrRejected):
		return "rejected"
	default:
		return "error"
	}
}

// ObserveRefusal counts a start of workflow (one this process serves)
// refused before admission (a malformed envelope, a missing required run
// ID).
func (a *Admitter) ObserveRefusal(entry, workflow string) {
	a.metrics.Start(metrics.Entry(entry), workflow, "error", "none")
}
