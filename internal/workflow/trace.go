package workflow

import (
	"errors"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// startStepSpan starts the jetflow.step span of attempt a of a step of
// d's run (nothing when tracing is off).
func (e *Executor) startStepSpan(d *delivery, a *stepAttempt) tracing.Span {
	return e.cfg.Tracer.StartStep(&d.run, tracing.StepAttempt{
		StepID: a.id, Name: a.name, Attempt: a.attempt, Worker: e.cfg.WorkerID, Start: a.start,
	})
}

// endStepSpan ends the span of attempt a with what execute returned: the
// committed record rec, or the settlement s of an attempt that committed
// nothing.
func endStepSpan(span tracing.Span, a *stepAttempt, rec *state.Step, s *settlement) {
	if !span.Active() {
		return // tracing off: nothing to build
	}
	span.TaskKeyHit(a.key.served())
	switch {
	case s != nil && s.kind == settleRetry:
		span.End(tracing.StepRetried, s.err)
	case s != nil && s.kind == settleDrop:
		span.End(tracing.StepDropped, s.err)
	case s != nil:
		span.End(tracing.StepReleased, s.err)
	case rec != nil && rec.Error != nil:
		span.End(tracing.StepFailed, errors.New(rec.Error.Message))
	default:
		span.End(tracing.StepCommitted, nil)
	}
}
