package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// errLeaseLost: the holder's lease was taken over by another delivery of
// the run (this one stalled past its lease): it must neither start a step
// nor commit nor settle its task message, which is no longer its own.
var errLeaseLost = errors.New("jetflow: the run's lease was taken over")

// errLeaseCancelled: the run's lease says the run was cancelled.
var errLeaseCancelled = errors.New("jetflow: the run was cancelled")

// lease is a holder's hold on a run generation's body (see state.Lease):
// the revision of the lease record every write of the holder is fenced by,
// and when the holder last proved it live.
//
// A holder proves its lease by its delivery (the broker has just handed it
// the run task, with the consumer's AckWait to run) and by every fenced
// write the broker accepts. The proof is good for two thirds of an AckWait:
// a holder whose last proof is older renews it before it starts a step
// (live), and every heartbeat renews it while a step runs (beat). A
// holder that stalled past its lease and lost it learns so at its next
// write, which the broker refuses (errLeaseLost), and from its own clock,
// which no longer lets it start a step without a write.
type lease struct {
	e   *Executor
	d   *delivery
	key string
	// renews: heartbeats renew the lease (false for a paused worker,
	// Hooks.NoHeartbeat).
	renews bool
	// lose cancels the delivery's context when the lease is lost.
	lose context.CancelCauseFunc

	mu sync.Mutex
	// rev is the revision of the lease record this holder fences with (0:
	// no record). written: the record at rev is this holder's own.
	rev     uint64
	written bool
	proved  time.Time
	lost    error
	// found is the record the holder found when it took the lease (zero
	// for a fresh run): its epoch.
	found state.Lease
	// unstarted, inherited: the hand-over's (handOver).
	unstarted, inherited bool
	// all: the park waits for every one of its waits (park); began: what
	// the park waits for was begun by its await (state.Lease.Began);
	// places: the waits' places (state.Lease.Places).
	all, began bool
	places     []int
	// begun, begunPlaces: the park's state.Lease.Begun.
	begun       []string
	begunPlaces []int
	// settled: the holder parked, released or handed the run over; a
	// heartbeat that comes after (its task is being settled) writes
	// nothing over that.
	settled bool
	// passed is the number of awaits the holder's body has passed (pass),
	// written with every record (state.Lease.Passed).
	passed atomic.Int64
}

// pass records that the holder's body passed await n.
func (l *lease) pass(n int) {
	for {
		old := l.passed.Load()
		if int64(n) <= old || l.passed.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// passedBefore is the number of awaits the holders before this one
// passed, as the lease record it found says: the body's first pass of
// any later await is this holder's.
func (l *lease) passedBefore() int { return l.found.PassedAwaits() }

// newLease is the lease of d's run held at revision rev of its record (0:
// none), found being that record, proved at proved.
func (e *Executor) newLease(d *delivery, rev uint64, found state.Lease, proved time.Time, lose context.CancelCauseFunc) *lease {
	return &lease{
		e: e, d: d, key: state.LeaseKey(d.identity()), rev: rev, found: found, proved: proved, lose: lose,
		renews: !e.cfg.Hooks.NoHeartbeat,
	}
}

// validFor is how long a proof of the lease lets the holder start steps.
func (l *lease) validFor() time.Duration { return l.d.msg.AckWait() * 2 / 3 }

// live returns nil when the holder may start a step: its lease is proved
// recent enough, or it was renewed now. A lost lease is its cause.
func (l *lease) live() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return l.lost
	}
	if time.Since(l.proved) < l.validFor() {
		return nil
	}
	return l.writeLocked(state.LeaseHeld, 0, nil)
}

// beat renews the lease at a heartbeat of the task message.
func (l *lease) beat() {
	if !l.renews {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil || l.settled {
		return
	}
	if err := l.writeLocked(state.LeaseHeld, 0, nil); err != nil && !errors.Is(err, errLeaseLost) && !errors.Is(err, errLeaseCancelled) {
		l.d.log.Warn().Err(err).Msg("cannot renew the run's lease; trying again at the next heartbeat")
	}
}

// park writes the lease parked at the body's await epoch, waiting for
// waits (every one of them when all, else any), and returns the record's
// revision once it is written: the holder's last write. A lost lease is
// its cause.
func (l *lease) park(epoch int, waits, begun []*Pending, all, began bool) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return 0, l.lost
	}
	l.all, l.began, l.places = all, began, make([]int, len(waits))
	for i, p := range waits {
		l.places[i] = p.seq
	}
	l.begun, l.begunPlaces = stepIDs(begun), make([]int, len(begun))
	for i, p := range begun {
		l.begunPlaces[i] = p.seq
	}
	err := l.writeLocked(state.LeaseParked, epoch, stepIDs(waits))
	l.settled = true
	return l.rev, err
}

// release writes the lease released, so that the redelivery of the task
// takes the run at once. It reports nothing: a release that cannot be
// written leaves the redelivery to wait out the lease.
func (l *lease) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settled = true
	if l.lost != nil || (!l.written && l.rev == 0) {
		return // nothing written: the redelivery finds no holder
	}
	if err := l.writeLocked(state.LeaseReleased, 0, nil); err != nil {
		l.d.log.Debug().Err(err).Msg("cannot write the lease released; the redelivery waits for it to run out")
	}
}

// leave leaves the run, which this holder blocked, for the next holder to
// begin every await again: a record this holder wrote is written released,
// keeping what the record it found said the run waited for (its epoch and
// waits: a later holder compares its body with them); a record it never
// wrote (it found the run parked, and replays without writes) stays as it
// is, and the next holder takes the run as cleanly as this one did. Like
// release, it reports nothing.
func (l *lease) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settled = true
	if l.lost != nil || !l.written {
		return
	}
	f := l.found
	rec := state.Lease{V: state.Version, State: state.LeaseReleased, Worker: l.e.cfg.WorkerID, Seq: l.d.seq, Delivered: l.d.delivered,
		Epoch: f.Epoch, Waits: f.Waits, Places: f.Places, All: f.All, Began: f.Began, Begun: f.Begun, BegunPlaces: f.BegunPlaces,
		Inherited: true, At: l.e.cfg.Now().UTC(),
		Passed: max(l.passedBefore(), int(l.passed.Load()))}
	b, err := state.Encode(rec)
	if err == nil {
		_, err = l.e.cfg.Assets.Steps.Update(l.d.nctx, l.key, b, l.rev)
	}
	if err != nil {
		l.d.log.Debug().Err(err).Msg("cannot write the blocked run's lease released; the next holder waits for it to run out")
	}
}

// handOver writes the lease released by a holder that starts no further
// step (a draining worker), like a delivery handed back unstarted: its
// redelivery takes the run as a holder that found it in the middle of
// something (it begins the awaits again), and counts no attempt for the
// step this holder reached without starting it, unless inherited (this
// holder took the run over and has committed nothing since: the step may
// have been started before it). Like release, it reports nothing.
func (l *lease) handOver(inherited bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return
	}
	l.unstarted, l.inherited, l.settled = true, inherited, true
	if err := l.writeLocked(state.LeaseReleased, 0, nil); err != nil {
		l.d.log.Debug().Err(err).Msg("cannot write the lease handed over; the redelivery waits for it to run out")
	}
}

// writeLocked writes the lease record in state with compare-and-set on the
// held revision. l.mu is held.
func (l *lease) writeLocked(st state.LeaseState, epoch int, waits []string) error {
	rec := state.Lease{
		V: state.Version, State: st, Worker: l.e.cfg.WorkerID, Seq: l.d.seq, Delivered: l.d.delivered,
		Epoch: epoch, Waits: waits, All: st == state.LeaseParked && l.all, Began: st == state.LeaseParked && l.began, At: l.e.cfg.Now().UTC(),
		Unstarted: l.unstarted, Inherited: l.inherited, Passed: max(l.passedBefore(), int(l.passed.Load())),
	}
	switch st {
	case state.LeaseParked:
		rec.Places, rec.Begun, rec.BegunPlaces = l.places, l.begun, l.begunPlaces
	case state.LeaseHeld:
		rec.Epoch = l.found.Epoch // a renewal keeps what the park before it recorded
	}
	if st != state.LeaseParked {
		// What the last park waited for stays on record until the next
		// park: steps begun and not committed, which every later holder's
		// body must start again where they were (history.awaiting).
		f := l.found
		rec.Waits, rec.Places, rec.All, rec.Began = f.Waits, f.Places, f.All, f.Began
		rec.Begun, rec.BegunPlaces = f.Begun, f.BegunPlaces
	}
	b, err := state.Encode(rec)
	if err != nil {
		return err
	}
	sent := time.Now()
	var rev uint64
	if l.rev == 0 {
		rev, err = l.e.cfg.Assets.Steps.Create(l.d.nctx, l.key, b)
	} else {
		rev, err = l.e.cfg.Assets.Steps.Update(l.d.nctx, l.key, b, l.rev)
	}
	if errors.Is(err, jetstream.ErrExists) || errors.Is(err, jetstream.ErrRevisionMismatch) {
		return l.loseLocked()
	}
	if err != nil {
		return err
	}
	l.rev, l.written, l.proved = rev, true, sent
	return nil
}

// commit writes a step record under key fenced by the lease, and returns
// its revision. A refused write loses the lease: errLeaseLost, or
// errLeaseCancelled when a cancel moved the fence.
func (l *lease) commit(key string, b []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return 0, l.lost
	}
	sent := time.Now()
	rev, err := l.e.cfg.Assets.Steps.PutFenced(l.d.nctx, key, b, l.key, l.rev)
	if errors.Is(err, jetstream.ErrFenced) {
		return 0, l.loseLocked()
	}
	if err != nil {
		return 0, err
	}
	l.proved = sent
	return rev, nil
}

// loseLocked records that the lease moved under the holder, and why: a
// cancel, or another holder. It reads the record to tell.
func (l *lease) loseLocked() error {
	l.lost = errLeaseLost
	if v, _, err := l.e.cfg.Assets.Steps.Get(l.d.nctx, l.key); err == nil {
		if rec, err := state.DecodeLease(v); err == nil && rec.State == state.LeaseCancelled {
			l.lost = errLeaseCancelled
		}
	}
	if l.lost == errLeaseCancelled {
		l.lose(ErrRunCancelled)
	} else {
		l.lose(l.lost)
	}
	return l.lost
}

// String describes the lease for logs.
func (l *lease) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("lease %s at revision %d", l.key, l.rev)
}
