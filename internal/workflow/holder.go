package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// holder is a run task's delivery that holds the run's lease: it executes
// the body, runs its sequential steps inline, begins its branches, waits
// and children, and parks or finishes the run.
type holder struct {
	e     *Executor
	d     *delivery
	lease *lease
	// fresh: the first delivery of the run's own start task; nothing of
	// the run is committed but what others delivered to it.
	fresh bool
	// clean: the first delivery of its message, holding a lease that no
	// holder before it left in the middle of something (no record, or
	// parked): what it finds begun at an await up to the lease's epoch is
	// done, and an inline step past it never started.
	clean bool
	// rebegin: the holder of a sweep's wake, which comes because
	// something the run waits for may be lost (a branch task or a timer):
	// it begins again what a clean holder would take as begun.
	rebegin bool
	// inherited: the first inline step this holder runs may have been
	// started by the holder it took the run over from (its attempt count
	// is read, not assumed).
	inherited bool
}

// accept makes the delivery of m and finds its workflow's definition,
// counting it in flight until done is called. It returns a nil delivery
// when m is not to be handled: undecodable (newDelivery settled it), or a
// task of a workflow this worker does not serve (released, for a worker
// that does).
func (e *Executor) accept(ctx context.Context, m *consume.Delivery) (d *delivery, def Definition, done func()) {
	if d = e.newDelivery(ctx, m); d == nil {
		return nil, def, nil
	}
	def, ok := e.cfg.Definitions[d.task.Workflow]
	if !ok {
		d.log.Error().Msg("task for a workflow this worker does not serve; releasing it")
		settleErr(d.log, m.Msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return nil, def, nil
	}
	e.cfg.Metrics.InFlight(1)
	return d, def, func() { e.cfg.Metrics.InFlight(-1) }
}

// handleRun handles one delivery of a run task: load the run, take its
// lease, replay its body and settle.
func (e *Executor) handleRun(ctx context.Context, m *consume.Delivery) {
	d, def, done := e.accept(ctx, m)
	if d == nil {
		return
	}
	defer done()
	if s := e.loadRun(d); s != nil {
		e.settleRun(d, nil, s)
		return
	}
	if e.elsewhere(d, def, d.run.Build) || e.notNewHere(d, def) {
		return
	}
	untrack := e.inflight.track(d, ctx)
	defer untrack()
	h, s := e.hold(d)
	if s != nil {
		e.settleRun(d, h.holder, s)
		return
	}
	if b := e.pinnedElsewhere(def, d, h.history); b != "" {
		d.log.Debug().Str("build", b).Msg("run pinned to another build before its first park: handed over")
		e.settleRun(d, h.holder, &settlement{kind: settleRelease, handOver: true, delay: e.bounceDelay(d, b)})
		return
	}
	m.OnBeat(h.lease.beat)
	if err := e.takeRerunPrefix(d, h.history); err != nil {
		s := &settlement{kind: settleRelease, err: fmt.Errorf("cannot take the rerun's source records: %w", err)}
		if errors.Is(err, ErrRerunSource) {
			s = &settlement{kind: settleFinish, err: err}
		}
		e.settleRun(d, h.holder, s)
		return
	}
	h.history.awaiting(h.lease.found)
	c := e.newContext(d, modeHolder, h.history)
	c.hold = h.holder
	e.settleRun(d, h.holder, c.replay(def))
}

// loadRun reads the run d's task stands for, and returns a settlement when
// the task must not touch it: a start whose run expired (dedupe's
// ErrStaleStart: it must never create a run), a task of another workflow's
// run, of a run that ended, of another generation, or of a run an earlier
// version's workers run. A start task's delivery reads the run's lease
// beside its record, and d.role says what the task is to the run
// (startRole).
func (e *Executor) loadRun(d *delivery) *settlement {
	var err error
	if d.task.Wake {
		d.run, d.rev, err = e.runs.Get(d.nctx, d.task.RunID)
		if errors.Is(err, runs.ErrNotFound) {
			return &settlement{kind: settleDrop, err: fmt.Errorf("%w: its record is gone", errRunNotRunning)}
		}
	} else {
		// A start task materialises the record if its publisher died
		// before writing it (a producer of an earlier version, which
		// publishes the start task first).
		leased := make(chan error, 1)
		go func() {
			var err error
			d.startLease, _, err = readLease(d.nctx, e.cfg.Assets.Steps, state.RunIdentity(d.task.RunID, d.task.Generation))
			leased <- err
		}()
		d.run, d.rev, err = e.cfg.Admitter.Materialize(d.nctx, d.task)
		if lerr := <-leased; err == nil && lerr != nil {
			err = fmt.Errorf("read the run's lease: %w", lerr)
		}
		if errors.Is(err, dedupe.ErrStaleStart) {
			return &settlement{kind: settleDrop, err: fmt.Errorf("stale start task, its run expired; no run created: %w", err)}
		}
	}
	d.role = startRole(d.task, d.run, d.seq, d.delivered, d.startLease)
	switch {
	case err != nil:
		return &settlement{kind: settleRelease, err: fmt.Errorf("cannot load run: %w", err)}
	case d.run.Workflow != d.task.Workflow:
		// A start of another workflow under this run ID (after the
		// broker's window): the stored run wins.
		return &settlement{kind: settleDrop, err: fmt.Errorf("the run ID holds a run of workflow %s", d.run.Workflow)}
	case d.task.Generation != d.run.Generation || d.run.Status.Terminal():
		// A late wake or a duplicate's start. A child run that ended may
		// not have told its parent yet (its holder died between the two
		// writes): tell it again. The redelivery of the task whose holder
		// ended the run writes the run's index entry if that holder died
		// before it could.
		if d.delivered > 1 && d.task.Generation == d.run.Generation {
			if _, err := e.runs.Reindex(d.nctx, d.run); err != nil {
				return &settlement{kind: settleRelease, err: fmt.Errorf("cannot check the run's index entry: %w", err)}
			}
		}
		if err := e.notifyParent(d.nctx, d.run); err != nil {
			return &settlement{kind: settleRelease, err: fmt.Errorf("cannot tell the parent that its child ended: %w", err)}
		}
		return &settlement{kind: settleDrop, err: fmt.Errorf("%w: it is %s (generation %d)", errRunNotRunning, d.run.Status, d.run.Generation)}
	case d.run.Exec != state.ExecLease:
		// A run of the executor before the lease is taken over through
		// that executor's own messages (adopt.go), once they are out of
		// the broker's duplicate window; no task of this executor does.
		return &settlement{kind: settleDrop, warn: true,
			err: errors.New("a run of the executor before the lease: taken over by its own next message, not by this task (docs/operations.md, Upgrading the engine)")}
	}
	return nil
}

// held is what hold found: the holder and the history it replays against.
type held struct {
	*holder
	history *history
}

// hold takes the lease of d's run. The first delivery of the run's fresh
// start task (roleFresh) holds it at once, reading nothing more; a stray
// start task (roleStray) takes nothing and is dropped without a replay.
// Any other delivery reads the run's records in one batch (its history,
// with the lease record) and decides by what the lease record says
// (holdDecision, a table read row by row): drop the task of a cancelled
// run; leave a message a later delivery holds; hold without a write after
// an unstarted hand-back or as a message's first delivery; wait out a
// holder that may be alive; otherwise take the lease over with
// compare-and-set and read the history again, so that it holds every
// commit its predecessor made before the takeover. After the park of the
// delivery just before this one, the taker is a clean holder that
// inherited nothing: that delivery started nothing after its park. The
// write is needed there too: that delivery may yet acknowledge the message
// late, and a wake's first delivery must then find the lease held, not
// parked at a revision this one executes at.
func (e *Executor) hold(d *delivery) (held, *settlement) {
	lease := func(rev uint64, found state.Lease, proved time.Time) *lease {
		return e.newLease(d, rev, found, proved, func(cause error) { e.inflight.cancelOne(d, cause) })
	}
	switch d.role {
	case roleStray:
		return held{}, &settlement{kind: settleStray, err: errors.New("a start task stored after the run was parked: no replay")}
	case roleFresh:
		h := &holder{e: e, d: d, fresh: true, clean: true, lease: lease(0, state.Lease{}, d.msg.Received)}
		return held{holder: h, history: newHistory()}, nil
	}
	var stale uint64 // a held lease revision found not renewed for a whole lease
	for {
		hist, err := e.readFenced(d.nctx, d.identity(), 0)
		if err != nil {
			return held{}, &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run's history: %w", err)}
		}
		found := state.Lease{}
		if hist.lease != nil {
			found = *hist.lease
		}
		switch holdDecision(hist.lease != nil, found, hist.leaseRev, stale, d.seq, d.delivered) {
		case foundCancelled:
			return held{}, e.cancelledLease(d)
		case foundLater:
			return held{}, &settlement{kind: settleLost, err: fmt.Errorf("%w: a later delivery of this task holds it", errLeaseLost)}
		case foundHandedBack:
			found.State = ""
			h := &holder{e: e, d: d, clean: found.Clean, inherited: found.Inherited, lease: lease(hist.leaseRev, found, d.msg.Received)}
			return held{holder: h, history: hist}, nil
		case foundFree:
			parked := found.State == state.LeaseParked
			h := &holder{e: e, d: d, clean: parked, inherited: !parked, rebegin: d.task.Wake && d.task.StepID == "",
				lease: lease(hist.leaseRev, found, d.msg.Received)}
			return held{holder: h, history: hist}, nil
		case foundHeld:
			expired, s := e.waitOut(d, hist.leaseRev)
			if s != nil {
				return held{}, s
			}
			stale = expired
			continue
		}
		// Take it over, then read everything committed before.
		l := lease(hist.leaseRev, found, d.msg.Received)
		l.mu.Lock()
		err = l.writeLocked(state.LeaseHeld, 0, nil)
		taken := l.rev
		l.mu.Unlock()
		if errors.Is(err, errLeaseLost) || errors.Is(err, errLeaseCancelled) {
			continue // written meanwhile: decide again on what is there now
		}
		if err != nil {
			return held{}, &settlement{kind: settleRelease, err: fmt.Errorf("cannot take the run's lease: %w", err)}
		}
		if hist, err = e.readFenced(d.nctx, d.identity(), taken); err != nil {
			l.release()
			return held{}, &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run's history: %w", err)}
		}
		d.log.Debug().Str("previous", string(found.State)).Msg("run's lease taken over")
		// After the park of the delivery just before this one, nothing
		// was started past the await: a clean holder, inheriting no
		// attempt (the step after the await counts attempt 1). Only the
		// very next delivery knows that: a later one's predecessor may
		// have taken the run and started a step.
		afterPark := found.State == state.LeaseParked && found.Seq == d.seq && found.Delivered == d.delivered-1
		return held{holder: &holder{e: e, d: d, lease: l, clean: afterPark, inherited: !afterPark}, history: hist}, nil
	}
}

// leaseFound is what a delivery that is not a fresh start's first found
// in its run's lease record: a row of hold's decision table (holdDecision).
type leaseFound int

const (
	// foundCancelled: the run was cancelled. The task is dropped.
	foundCancelled leaseFound = iota
	// foundLater: a later delivery of this very message holds the run. The
	// message is its own now: left alone.
	foundLater
	// foundHandedBack: the delivery just before this one handed the
	// message back without starting anything. The run is taken as that
	// delivery found it, without a write: it ran nothing, and any holder
	// before it is fenced. Only the very next delivery may; a later one
	// finds the record of a delivery before the one before it, which may
	// be executing the body at this revision (stalled past AckWait before
	// it began), and takes the lease over with a write (foundStale), which
	// fences that one.
	foundHandedBack
	// foundFree: the message's first delivery, and no lease record, or one
	// another message's delivery parked or released. Held at that revision
	// without a write: at most one run task is pending at a time, and the
	// holder of any earlier one parked or finished.
	foundFree
	// foundHeld: held by another delivery, which may be alive. It is waited
	// out (it ends, parks, hands back, or stops renewing), then the table
	// is read again.
	foundHeld
	// foundStale: anything else (a redelivery; a holder waited out that
	// stopped renewing; the park of the delivery before this one). The
	// lease is taken over with a compare-and-set write, and the history
	// read again at that revision.
	foundStale
)

// holdDecision is hold's decision table, read top to bottom; the first row
// that matches decides. has says whether a lease record exists (found is
// its content, at revision rev); stale is a revision waitOut found not
// renewed for a whole lease; seq and delivered name this delivery.
//
//	row | the lease record                                             | this delivery        | decision
//	1   | cancelled                                                    | any                  | foundCancelled
//	2   | written by this message's delivery                           | an earlier one       | foundLater
//	3   | handed back unstarted by this message's delivery             | the next one         | foundHandedBack
//	4   | none, or another message's, not held                         | its message's first  | foundFree
//	5   | held, not found stale, by another delivery than this one     | any                  | foundHeld
//	6   | anything else                                                | any                  | foundStale
func holdDecision(has bool, found state.Lease, rev, stale, seq uint64, delivered int) leaseFound {
	thisMessage := found.Seq == seq
	switch {
	case found.State == state.LeaseCancelled:
		return foundCancelled
	case thisMessage && found.Delivered > delivered:
		return foundLater
	case found.Unstarted && thisMessage && found.Delivered == delivered-1:
		return foundHandedBack
	case delivered == 1 && (!has || !thisMessage && found.State != state.LeaseHeld):
		return foundFree
	case found.State == state.LeaseHeld && rev != stale && !(thisMessage && found.Delivered == delivered):
		return foundHeld
	}
	return foundStale
}

// waitOut waits while the lease record at rev is held by a delivery that
// may be alive: until it changes, or has not changed for a whole lease
// (by this worker's clock: then its holder is dead or stalled past its
// lease, and has stopped itself; waitOut returns the revision it found
// stale), or the run ends. It returns a settlement when this delivery has
// nothing to do: the run ended, or the holder it waited for parked or
// handed the run back (this very message may be settled then: a nak lets
// the broker redeliver it if it is still there).
func (e *Executor) waitOut(d *delivery, rev uint64) (uint64, *settlement) {
	key := state.LeaseKey(d.identity())
	since := time.Now()
	for {
		poll := max(d.msg.AckWait()/4, 10*time.Millisecond)
		select {
		case <-d.ctx.Done():
			return 0, &settlement{kind: settleRelease, err: d.ctx.Err()}
		case <-time.After(poll):
		}
		run, _, err := e.runs.Get(d.nctx, d.run.RunID)
		if err == nil && (run.Status.Terminal() || run.Generation != d.run.Generation) {
			return 0, &settlement{kind: settleDrop, err: fmt.Errorf("%w: it is %s", errRunNotRunning, run.Status)}
		}
		v, now, err := e.cfg.Assets.Steps.Get(d.nctx, key)
		switch {
		case err != nil:
			return 0, &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run's lease: %w", err)}
		case now != rev:
			if l, err := state.DecodeLease(v); err == nil && l.State != state.LeaseHeld {
				return 0, &settlement{kind: settleRelease, delay: time.Millisecond, err: errors.New("the holder waited for settled the run")}
			}
			rev, since = now, time.Now() // renewed: alive
		case time.Since(since) >= d.msg.AckWait():
			d.log.Info().Msg("the run's lease was not renewed for a whole lease: taking it over")
			return rev, nil
		}
	}
}

// cancelledLease is the settlement of a delivery that finds its run's
// lease cancelled: the task is dropped. A record that still says running
// is a cancel between its two writes: the task waits for it once (its
// redelivery comes after ReleaseDelay), and a redelivery that still finds
// it so finishes the cancel, whose writer died between the two.
func (e *Executor) cancelledLease(d *delivery) *settlement {
	run, _, err := e.runs.Get(d.nctx, d.run.RunID)
	switch {
	case errors.Is(err, runs.ErrNotFound):
		return &settlement{kind: settleDrop, err: errLeaseCancelled}
	case err != nil:
		return &settlement{kind: settleRelease, err: err}
	case run.Status.Terminal() || run.Generation != d.run.Generation:
		return &settlement{kind: settleDrop, err: errLeaseCancelled}
	case d.delivered < 2:
		return &settlement{kind: settleRelease, err: errors.New("the run's lease is cancelled and its record not yet: a cancel under way")}
	}
	if err := e.cancels.Finish(d.nctx, d.run.RunID); err != nil {
		return &settlement{kind: settleRelease, err: fmt.Errorf("cannot finish the run's cancel: %w", err)}
	}
	d.log.Warn().Msg("finished the cancel of a run whose canceller stopped between its writes")
	return &settlement{kind: settleDrop, err: errLeaseCancelled}
}
