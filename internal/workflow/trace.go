package workflow

import (
	"errors"

	"github.com/jetflow/jetflow/internal/jetstream"
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

// passed is the holder's pass of the await c.epoch over ps (with first,
// ps[won] the first committed): the lease records the pass, and each wait
// or child this await is the first of the replay to decide on (every one
// of ps, or the winner of first) has its jetflow.wait span emitted, when
// this await is one no holder before this one passed.
//
// That makes the span once per wait without a write of its own: the first
// await that decides on a wait is the same on every replay (an await of
// all returns only once its steps are committed, and the winner of first
// is the lowest revision), and every holder that passes an await records
// it in every later lease record it writes (state.Lease.Passed, at a
// renewal, a park, a release or a hand-over), which the next holder
// reads: only the first holder to pass the await sees it as new. A
// holder that dies after passing it and before writing the lease again
// (or whose run is taken over while it stalls) leaves it new to the
// next: that wait's span is emitted twice then.
func (h *holder) passed(c *Context, ps []*Pending, first bool, won int) {
	n := c.epoch
	h.lease.pass(n)
	unpassed := n > h.lease.passedBefore()
	for i, p := range ps {
		if first && i != won || p.decided {
			continue
		}
		p.decided = true
		if unpassed && (p.class == classWait || p.class == classChild) && h.e.cfg.Tracer.On() {
			h.traceWait(p)
		}
	}
}

// traceWait emits the jetflow.wait span of p, a wait or child step the
// holder has just seen ended: from its wait record's Since (read from the
// attempts bucket unless this replay began the wait) to its record's
// commit. A wait with no wait record (the body reached it after its
// event, or its child's end, was committed, and began nothing) spans no
// time, at the moment the body reached it.
func (h *holder) traceWait(p *Pending) {
	rec, mark := p.rec, p.mark
	if mark == nil {
		v, _, err := h.e.cfg.Assets.Attempts.Get(h.d.nctx, state.WaitKey(p.id))
		switch {
		case err == nil:
			if w, derr := state.DecodeWait(v); derr == nil {
				mark = &w
			}
		case !errors.Is(err, jetstream.ErrNotFound):
			h.d.stepEvent(h.d.log.Debug().Err(err), p.id).Msg("cannot read the wait's record for its span; it starts at its end")
		}
	}
	w := tracing.WaitEnd{StepID: p.id, Name: p.name, Ended: rec.Committed, EventID: rec.EventID,
		Delivery: rec.TraceParent, Worker: h.e.cfg.WorkerID, Until: rec.WakeAt}
	if mark != nil {
		w.Since, w.Until = mark.Since, mark.Until
	} else {
		w.Since = h.e.cfg.Now()
	}
	switch {
	case p.call.child != nil:
		w.Kind, w.Child = state.WaitChild, p.call.child.RunID
	case p.call.wait != nil:
		w.Kind, w.Event, w.HookToken = p.call.wait.Kind, p.call.wait.Event, p.call.wait.Token != ""
	}
	w.Outcome, w.ChildStatus, w.Error = waitOutcome(rec, w.Kind)
	if w.Ended.Before(w.Since) {
		// An event or a child's end committed before the body reached the
		// wait (by the two clocks), or a record this replay committed
		// just now (a hook taken, a child refused).
		w.Ended = w.Since
		w.Early = w.Outcome == tracing.WaitEvent || w.Outcome == tracing.WaitChildEnded
	}
	h.e.cfg.Tracer.EndWait(&h.d.run, w)
}

// waitOutcome is the outcome of the wait of kind whose record is rec (the
// Wait outcomes of internal/tracing), how its child ended, and the
// message of an outcome that is an error.
func waitOutcome(rec *state.Step, kind string) (outcome, child, errMsg string) {
	kindOf := ""
	if rec.Error != nil {
		kindOf = rec.Error.Kind
	}
	switch {
	case kind == state.WaitChild && kindOf == KindChildRefused:
		return tracing.WaitChildRefused, "", rec.Error.Message
	case kind == state.WaitChild:
		status := childStatus(kindOf)
		if status == "" {
			status = state.StatusCompleted
		}
		return tracing.WaitChildEnded, string(status), ""
	case kindOf == KindTimeout:
		return tracing.WaitTimeout, "", ""
	case kindOf == KindHookTaken:
		return tracing.WaitHookTaken, "", rec.Error.Message
	case kind == state.StepSleep:
		return tracing.WaitSlept, "", ""
	}
	return tracing.WaitEvent, "", ""
}
