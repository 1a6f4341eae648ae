package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// handleBranch handles one delivery of a branch task: a step the body
// started beside others (see Pending). The task runs only its own step: it
// reads the run's record, its own step's and lease records, and the run's
// history as the holder that published it knew it (a run that ended, or
// was cancelled, starts no step; a step committed already is done),
// replays the body as far as the step's call to reach its function, runs
// it, commits it with create-if-absent and wakes the run. It decides
// nothing about other steps, and never continues the body.
func (e *Executor) handleBranch(ctx context.Context, m *consume.Delivery) {
	d, def, done := e.accept(ctx, m)
	if d == nil {
		return
	}
	defer done()
	d.run, d.rev = state.RunFromTask(d.task), d.task.Rev
	if isBlockPoke(d.task) {
		e.wakeUnblocked(d)
		return
	}
	if e.elsewhere(d, def, d.task.Build) {
		return
	}
	untrack := e.inflight.track(d, ctx)
	defer untrack()
	hist, s := e.branchHistory(d)
	if s == nil {
		s = e.replayBranch(d, def, hist)
	}
	if s.unreached && d.task.Upto > 0 {
		// The history as the holder knew it does not reach the step,
		// which it should: replay against all of it before giving up.
		if hist, err := e.readHistory(d.nctx, d.identity(), 0); err != nil {
			s = &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run's history: %w", err)}
		} else {
			s = e.replayBranch(d, def, hist)
		}
	}
	e.settleBranch(d, s)
}

// replayBranch replays def's body against hist as far as d's step, and
// runs it.
func (e *Executor) replayBranch(d *delivery, def Definition, hist *history) *settlement {
	if hist.lease != nil {
		hist.awaiting(*hist.lease)
	}
	c := e.newContext(d, modeBranch, hist)
	c.branch = d.task.StepID
	return c.replay(def)
}

// branchHistory reads, side by side, the run's record, the records of the
// branch's step and of the run's lease, and the run's history up to the
// task's Upto (nothing when it is 0). It returns a settlement when the
// branch has nothing to run: its run ended or was cancelled (drop), or its
// step is committed (done: the run is woken again, in case the attempt
// that committed it died before).
func (e *Executor) branchHistory(d *delivery) (*history, *settlement) {
	var (
		run     state.Run
		own     []jetstream.Entry
		hist    = newHistory()
		g, gctx = errgroup.WithContext(d.nctx)
	)
	g.Go(func() (err error) {
		run, _, err = e.runs.Get(gctx, d.run.RunID)
		return err
	})
	g.Go(func() (err error) {
		own, err = e.cfg.Assets.Steps.Last(gctx, d.task.StepID, state.LeaseKey(d.identity()))
		return err
	})
	if d.task.Upto > 0 {
		g.Go(func() (err error) {
			hist, err = e.readHistory(gctx, d.identity(), d.task.Upto)
			return err
		})
	}
	err := g.Wait()
	if err == nil {
		err = hist.add(own)
	}
	switch {
	case errors.Is(err, runs.ErrNotFound):
		return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: its record is gone", errRunNotRunning)}
	case err != nil:
		return nil, &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run: %w", err)}
	case run.Token != d.run.Token || run.Generation != d.run.Generation:
		return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: the run ID holds another run now", errRunNotRunning)}
	case !run.Status.Active() || hist.lease != nil && hist.lease.State == state.LeaseCancelled:
		return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: it is %s", errRunNotRunning, run.Status)}
	}
	if rec := hist.get(d.task.StepID); rec != nil && !(slices.Contains(run.Waived, rec.StepID) && run.WaivedRev[rec.StepID] == rec.Rev) {
		return nil, &settlement{kind: settleDone, rec: rec}
	}
	d.run.Waived, d.run.WaivedRev = run.Waived, run.WaivedRev
	return hist, nil
}

// runBranch runs p, the branch task's own step, which the body has just
// started, and returns how to settle the task (it never returns to the
// body).
func (e *Executor) runBranch(c *Context, p *Pending) *settlement {
	d := c.delivery
	if p.rec != nil {
		return &settlement{kind: settleDone, rec: p.rec}
	}
	if p.call.fn == nil {
		return &settlement{kind: settleDrop, err: fmt.Errorf("the body starts %s as a wait or a child, not a step: it does not replay the same way", p.id)}
	}
	attempt, err := e.beginAttempt(d)
	if errors.Is(err, errNotThisTask) {
		return &settlement{kind: settleDrop, err: err}
	}
	if err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	if attempt > 1 {
		// A redelivery can come while the attempt before it still runs
		// (its worker stalled past the AckWait) and commits after this
		// task's read: read the record again just before the function
		// runs, so that such a commit is the result, not a second run.
		stored, err := e.lookup(d, p.id)
		if err != nil {
			return &settlement{kind: settleRelease, err: err}
		}
		if stored != nil {
			d.log.Info().Int("attempt", attempt).Msg("branch was committed by an earlier attempt after this task read it; keeping its result")
			return &settlement{kind: settleDone, rec: stored}
		}
	}
	key, err := e.keyCall(d, p.call)
	if err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	a := &stepAttempt{stepCall: p.call, attempt: attempt, key: key, start: e.cfg.Now()}
	rec, s := e.runAttempt(d, a, func(id string, b []byte) (uint64, error) { return e.createOver(d, id, b) })
	if s != nil {
		return s
	}
	return &settlement{kind: settleDone, rec: rec}
}

// wakes reports whether this branch's commit, just made, must wake its
// run. It need not when the run's lease is not parked: its holder (or the
// delivery that takes the run next) reads the run's records after this
// commit — a holder looks again at what it waits for once it has parked.
// Nor when the run is parked waiting for all of several steps, this
// branch's among them, and another of them is still missing: the commit of
// the last of them wakes the run (a wake would only replay the body to
// park it again). Of two branches that commit at once, the one that
// commits later reads the other's commit and wakes the run.
//
// That reasoning needs reads that see every acknowledged write: on a
// replicated bucket, whose batch reads may come from a lagging replica,
// every branch wakes its run. So does a branch of a run of an earlier
// version's executor, and one whose read fails. The check costs a read
// of the lease, and one batch read of the other waits when the run is
// parked on at most maxWaitsChecked of them (a wider park is not checked:
// every branch wakes it).
func (e *Executor) wakes(d *delivery) bool {
	steps := e.cfg.Assets.Steps
	if steps.Replicated() || d.run.Exec != state.ExecLease {
		return true
	}
	l, _, err := readLease(d.nctx, steps, d.identity())
	switch {
	case err != nil:
		return true
	case l == nil:
		return false // the first holder, which has not parked yet
	case l.State != state.LeaseParked:
		return false // held, handed back or cancelled
	case d.task.Width > maxWaitsChecked || !slices.Contains(l.Waits, d.task.StepID):
		return true
	}
	decided, err := awaitDecided(d.nctx, steps, *l, d.task.StepID)
	return err != nil || decided
}

// maxWaitsChecked bounds the steps wakes reads in one batch.
const maxWaitsChecked = 64

// settleBranch carries out s on a branch task's delivery.
func (e *Executor) settleBranch(d *delivery, s *settlement) {
	msg := d.msg.Msg
	switch s.kind {
	case settleDone:
		if !e.wakes(d) {
			settleErr(d.log, msg.Ack(), "ack")
			return
		}
		if _, err := Wake(d.nctx, e.cfg.Assets, d.run, d.rev, d.task.StepID, d.task.StepID+".wake"); err != nil {
			// The redelivery finds the commit and wakes the run again.
			d.log.Warn().Err(err).Msg("cannot wake the run after its branch committed; releasing")
			settleErr(d.log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
			return
		}
		settleErr(d.log, msg.Ack(), "ack")
	case settleRetry:
		e.retryBranch(d, s)
	case settleBlock:
		e.settleBlocked(d.nctx, d, nil, s)
	case settleDrop, settleLost:
		d.log.Info().Err(s.err).Msg("branch task dropped")
		settleErr(d.log, msg.Ack(), "ack")
	default: // release
		if s.err != nil {
			d.log.Warn().Err(s.err).Msg("branch task released")
		}
		delay := e.cfg.ReleaseDelay
		if s.delay > 0 {
			delay = s.delay
		}
		settleErr(d.log, msg.NakWithDelay(delay), "nak")
	}
}

// timerMinDelay is the shortest backoff of a branch kept in a timer. A
// shorter one waits as a delayed NAK: that keeps the task ack-pending on
// its consumer for the delay, which is harmless for a moment but, over a
// long backoff during a downstream outage, could fill the consumer's
// MaxAckPending and stall every task of the workflow.
const timerMinDelay = 2 * time.Second

// retryBranch settles a branch task whose step failed and is to run again
// after s.delay. A long delay is stored as a timer carrying the next
// attempt number, after the failed attempt is recorded (so that a task
// redispatched meanwhile counts on from it), and only then is the task
// acknowledged (and the ack confirmed). If the worker dies in between, the
// task is redelivered and runs early, as after any crash; the timer's task
// then finds its attempt already started and is dropped.
func (e *Executor) retryBranch(d *delivery, s *settlement) {
	msg := d.msg.Msg
	err := e.recordFailure(d.nctx, s, s.attempt, time.Time{})
	if s.delay < timerMinDelay {
		if err != nil {
			d.log.Warn().Err(err).Msg("cannot log the failed attempt; retrying all the same")
		}
		settleErr(d.log, msg.NakWithDelay(s.delay), "nak")
		return
	}
	t := d.task
	t.Attempt, t.Redispatched = s.attempt+1, false
	if err == nil {
		err = e.storeTimer(d, jetstream.BranchTimer(d.run.Workflow, t.StepID), state.TaskMsgID(d.run, t.StepID+"#"+strconv.Itoa(t.Attempt)), t, e.cfg.TimerNow().Add(s.delay))
	}
	if err != nil {
		d.log.Warn().Err(err).Msg("cannot store the retry timer; the task waits ack-pending instead")
		settleErr(d.log, msg.NakWithDelay(s.delay), "nak")
		return
	}
	actx, cancel := context.WithTimeout(d.nctx, 10*time.Second)
	defer cancel()
	settleErr(d.log, msg.DoubleAck(actx), "ack")
}

// beginAttempt returns the number of the attempt about to run the branch
// task's step, and makes sure no other delivery gets the same number. The
// step's attempt record holds the highest attempt started.
//
//   - The first delivery of a task message at attempt 1 costs nothing: it
//     is attempt 1.
//   - A redelivery reads and advances the record with compare-and-set
//     before the step runs. Finding no record, it counts the first delivery
//     as having run (it may have crashed mid-step), unless that delivery
//     was handed back unstarted (release writes the record).
//   - The first delivery of a retry (a message stored for attempt n > 1)
//     records n, so that its own redelivery is n+1; if attempt n already
//     started (its failed task was redelivered after a crash), the retry
//     is not this task's to run (errNotThisTask).
//   - A redispatched task first checks that no retry timer of the step is
//     waiting — the timer owns the next attempt, errNotThisTask — and
//     counts on from the record.
//
// Attempts are thus counted per start of the step, not per delivery: a
// delivery that never ran the step does not use up MaxAttempts.
func (e *Executor) beginAttempt(d *delivery) (int, error) {
	first := max(1, d.task.Attempt)
	stray := d.task.Redispatched
	if d.delivered <= 1 && first == 1 && !stray {
		return 1, nil
	}
	if stray && d.delivered <= 1 {
		// Published while no task of the step was pending: the step may
		// be waiting for a retry timer, which owns its next attempt.
		waiting, err := jetstream.HasTimer(d.nctx, e.cfg.Assets.Timers, jetstream.BranchTimer(d.run.Workflow, d.task.StepID), false)
		if err != nil {
			return 0, err
		}
		if waiting {
			return 0, fmt.Errorf("%w: a retry of the step waits as a timer", errNotThisTask)
		}
	}
	var attempt int
	err := e.editAttemptLog(d.nctx, d.task.StepID, func(l *state.AttemptLog, found bool) (bool, error) {
		switch {
		case !found && d.delivered > 1 && first == 1:
			attempt = 2 // the first delivery ran attempt 1 without a record
		case !found:
			attempt = first
		case first > 1 && d.delivered <= 1 && l.Started >= first:
			// A retry timer's task whose attempt already ran (its failed
			// task was redelivered after a crash instead).
			return false, fmt.Errorf("%w: attempt %d already started", errNotThisTask, first)
		default:
			attempt = max(first, l.Started+1)
		}
		l.Started = attempt // a concurrent delivery that takes this number first makes this one read again
		return true, nil
	})
	return attempt, err
}
