package workflow

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// errWorkerStopping: the worker drains; the run goes on elsewhere.
var errWorkerStopping = errors.New("jetflow: worker stopping: the run goes on on another worker")

// inlineRetryMax is the longest backoff a holder waits out in place,
// holding its run and its slot: a longer one parks the run on a timer.
const inlineRetryMax = 2 * time.Second

// runInline runs p, the sequential step the body awaits alone, under the
// holder's lease, and gives p its committed record. A failed attempt is
// retried in place after a short backoff, or parks the run until its
// timer after a long one. It returns the settlement of a step that
// commits nothing in this task.
//
// Between the commit of one sequential step and the start of the next the
// holder makes no request: the commit's acceptance proves the lease, and
// the lease proves that no other delivery runs the body.
func (h *holder) runInline(c *Context, p *Pending) *settlement {
	if h.e.stopping() {
		// Draining: hand the run over at this step boundary, before the
		// step starts (the lease says so: another worker takes the run at
		// once and counts no attempt for it) rather than hold the drain
		// for the rest of the body.
		return &settlement{kind: settleRelease, handOver: true, delay: time.Millisecond, err: errWorkerStopping}
	}
	attempt, s := h.attemptFor(c, p)
	if s != nil {
		return s
	}
	var failures []state.AttemptFailure
	for {
		if err := h.lease.live(); err != nil {
			return lostOr(err)
		}
		if err := h.d.ctx.Err(); err != nil {
			return stopped(h.d, err)
		}
		key, err := h.e.keyCall(h.d, p.call)
		if err != nil {
			return &settlement{kind: settleRelease, err: err}
		}
		// The lease is proved once more right before the call: a process
		// stopped (SIGSTOP, a VM paused) after the check above and resumed
		// past its lease renews it first, finds it taken and calls
		// nothing. What remains is the instant between that proof and
		// the call.
		a := &stepAttempt{stepCall: p.call, attempt: attempt, key: key, start: h.e.cfg.Now(), failures: failures, mayCall: h.lease.live}
		rec, s := h.e.runAttempt(h.d, a, h.lease.commit)
		if s == nil {
			p.rec = rec
			c.hist.put(rec)
			h.inherited = false
			return nil
		}
		if s.kind != settleRetry {
			return s
		}
		if s.delay > inlineRetryMax {
			return h.retryLater(c, p, s)
		}
		if err := h.e.recordFailure(h.d.nctx, s, s.attempt+1, time.Time{}); err != nil {
			h.d.log.Warn().Err(err).Msg("cannot log the failed attempt; retrying all the same")
		}
		failures = append(failures, h.e.failure(s))
		select {
		case <-h.d.ctx.Done():
			return stopped(h.d, h.d.ctx.Err())
		case <-time.After(s.delay):
		}
		attempt++
	}
}

// retryLater parks the run until the next attempt of p, after the failed
// attempt s: the failure is logged with the time the next attempt may
// start, and a timer is stored that wakes the run then for that attempt.
// A holder that takes the run over before then finds the log and parks
// too, so no wake-up starts the attempt early.
func (h *holder) retryLater(c *Context, p *Pending, s *settlement) *settlement {
	due := h.e.cfg.TimerNow().Add(s.delay)
	if err := h.e.recordFailure(h.d.nctx, s, s.attempt, due); err != nil {
		return &settlement{kind: settleRelease, err: fmt.Errorf("cannot log the failed attempt: %w", err)}
	}
	if err := h.storeRetryTimer(c, p, s.attempt+1, due); err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	return &settlement{kind: settlePark, epoch: c.epoch, waits: []*Pending{p}, begun: c.begunBesides([]*Pending{p})}
}

// retryOf reports whether the holder's task is the retry timer of p.
func (h *holder) retryOf(p *Pending) bool {
	return h.d.task.Wake && h.d.task.StepID == p.id && h.d.task.Attempt > 0
}

// attemptFor numbers the attempt of p this holder is about to run. A step
// no earlier holder can have started runs attempt 1 and costs nothing: on
// a fresh run, after this holder ran another step, or past the await a
// clean takeover found the run parked at. Otherwise the step's attempt log
// decides, and is advanced with compare-and-set: the next attempt after
// the highest started; attempt 2 when there is no log but the holder
// before may have been running the step when it died (it counts); and a
// park, when the log says a retry waits for its timer.
func (h *holder) attemptFor(c *Context, p *Pending) (int, *settlement) {
	switch {
	case h.fresh:
		return 1, nil
	case h.retryOf(p), h.inherited:
	case h.clean && p.epoch < h.lease.found.Epoch:
	default:
		return 1, nil
	}
	now := h.e.cfg.TimerNow()
	var (
		attempt  int
		waitTill time.Time
	)
	err := h.e.editAttemptLog(h.d.nctx, p.id, func(l *state.AttemptLog, found bool) (bool, error) {
		switch {
		case found && l.NotBefore.After(now):
			attempt, waitTill = l.Started+1, l.NotBefore
			return false, nil
		case found && h.retryOf(p):
			attempt = max(l.Started+1, h.d.task.Attempt)
		case found:
			attempt = l.Started + 1
		case h.retryOf(p):
			attempt = h.d.task.Attempt
		case h.inherited:
			attempt = 2 // the holder before may have been running it
		default:
			attempt = 1
			return false, nil
		}
		l.Started, l.NotBefore = attempt, time.Time{}
		return true, nil
	})
	if err != nil {
		return 0, &settlement{kind: settleRelease, err: fmt.Errorf("cannot number the attempt: %w", err)}
	}
	if !waitTill.IsZero() {
		if h.retryOf(p) {
			// The retry's own timer, early by this worker's clock.
			return 0, &settlement{kind: settleRelease, delay: waitTill.Sub(now),
				err: fmt.Errorf("retry of %s due at %s came early by this worker's clock", p.id, waitTill.Format(time.RFC3339Nano))}
		}
		// Park until the retry's timer. The holder that logged the wait
		// may have died before it stored the timer: store it (again; a
		// stored one is kept).
		if err := h.storeRetryTimer(c, p, attempt, waitTill); err != nil {
			return 0, &settlement{kind: settleRelease, err: err}
		}
		return 0, &settlement{kind: settlePark, epoch: c.epoch, waits: []*Pending{p}, begun: c.begunBesides([]*Pending{p})}
	}
	return attempt, nil
}

// storeRetryTimer stores the timer that wakes the run for attempt of p at
// due; a timer stored for it before is kept.
func (h *holder) storeRetryTimer(c *Context, p *Pending, attempt int, due time.Time) error {
	t := state.StepTask(c.run, c.rev, p.id)
	t.Wake, t.Attempt = true, attempt
	if err := h.e.storeTimer(h.d, jetstream.RunTimer(c.run.Workflow, p.id), state.TaskMsgID(c.run, p.id+"#"+strconv.Itoa(attempt)), t, due); err != nil {
		return fmt.Errorf("cannot store the retry timer: %w", err)
	}
	return nil
}
