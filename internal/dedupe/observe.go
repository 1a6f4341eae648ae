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
	var outcome string
	switch {
	case err == nil:
		outcome = res.Outcome.String()
	case errors.Is(err, ErrConflict):
		outcome = "conflict"
	case errors.Is(err, ErrRejected):
		outcome = "rejected"
	default:
		outcome = "error"
	}
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

// ObserveRefusal counts a start of workflow (one this process serves)
// refused before admission (a malformed envelope, a missing required run
// ID).
func (a *Admitter) ObserveRefusal(entry, workflow string) {
	a.metrics.Start(metrics.Entry(entry), workflow, "error", "none")
}
