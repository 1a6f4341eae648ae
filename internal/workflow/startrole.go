package workflow

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// taskRole is what a run task's delivery is to its run (startRole).
type taskRole int

const (
	// roleWake: a wake (state.Task.Wake). hold decides how its delivery
	// takes the run.
	roleWake taskRole = iota
	// roleFresh: the first delivery of the run's own start task, and no
	// delivery of any task has held the run: it holds the run at once and
	// reads nothing more (its fence: the lease never written).
	roleFresh
	// roleHold: a start task that may be the one task the run has — no
	// other message's delivery has parked the run — but is not its fresh
	// start: a redelivery of it, or the task of a start whose publisher
	// died before the record, which another start created with its own
	// token. Its delivery takes the run as a wake's does, reading the
	// history.
	roleHold
	// roleStray: a start task stored after another message's delivery
	// parked the run: a duplicate's task (a producer of an earlier version
	// published it before it found the record), or the run's own start task
	// published late by a stalled creator (the run was woken without it).
	// It is acknowledged without a replay (settleStray).
	roleStray
)

// startRole is the one place that decides what a run task is to the run
// it stands for: run, its record (of the task's generation and running:
// loadRun settled every other task), and lease, the run's lease record as
// read after the task's delivery (nil: never written; read for start
// tasks only). seq and delivered are the delivery's stream sequence and
// delivery count.
//
//   - A wake is a wake (roleWake): it is published to make the body go on.
//   - A start task finding the lease parked by another message's delivery
//     is a stray (roleStray): the run was held, and parked, before this
//     task was stored. A run has at most one run task stored at a time, and
//     a holder writes the lease parked before its task goes, so the task
//     came after; the body is where that park left it, and whatever
//     commits what the park awaits wakes it. A duplicate start's task must
//     not hand the body to a holder (G25): it is acknowledged, and then
//     what it may have absorbed is looked at (strayLook).
//   - The run's own start task (its token), at its first delivery, finding
//     no lease record, is the run's fresh start (roleFresh): nothing can
//     have been started yet, since any holder that stopped holding the run
//     wrote the lease (parked, released) or ended the run. A run taken over
//     from the executor before the lease (Run.Adopted) has none: its
//     steps were committed without a lease.
//   - Anything else (roleHold) may be the one task that moves the run: a
//     start task with another token finding no lease is the task of a
//     publisher that died before the record, whose start another call
//     created (that call's own start task then finds it stored); a
//     redelivery may follow a holder that died holding. Its delivery
//     takes the run the careful way, reading the history (hold). A lease
//     held or released by another message while this task is stored means
//     that message was lost (purged, terminated): this task takes over.
//
// The decision costs a start task one read of the lease key, made beside
// the read of the run's record (loadRun); a wake none.
func startRole(t state.Task, run state.Run, seq uint64, delivered int, lease *state.Lease) taskRole {
	switch {
	case t.Wake:
		return roleWake
	case lease != nil && lease.State == state.LeaseParked && lease.Seq != seq:
		return roleStray
	case lease == nil && delivered == 1 && t.Token == run.Token && !run.Adopted:
		return roleFresh
	}
	return roleHold
}

// readLease reads the lease record of the run generation identity and its
// revision (nil, 0: never written).
func readLease(ctx context.Context, steps *jetstream.KV, identity string) (*state.Lease, uint64, error) {
	v, rev, err := steps.Get(ctx, state.LeaseKey(identity))
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	l, err := state.DecodeLease(v)
	if err != nil {
		return nil, 0, err
	}
	return &l, rev, nil
}

// strayLook settles a stray start task's delivery d (roleStray): its
// acknowledgement, then a look at what the parked run awaits. While it was
// stored, the stray absorbed every wake published on the run's subject; a
// wake published after its acknowledgement waits for it to leave the
// stream (Wake, storedTaskReplays), and the commit of one published
// before it is seen here: if the await the run is parked at (its lease,
// as d found it) can be decided now, the run is woken, under the message
// ID <identity>.stray.<seq>. Nothing is replayed when it cannot.
func (e *Executor) strayLook(d *delivery) {
	ctx, cancel := context.WithTimeout(d.nctx, 10*time.Second)
	err := d.msg.Msg.DoubleAck(ctx)
	cancel()
	if err != nil {
		// Delivered again after AckWait, and judged again.
		d.log.Warn().Err(err).Msg("cannot confirm the acknowledgement of a stray start task")
		return
	}
	decided, err := awaitDecided(d.nctx, e.cfg.Assets.Steps, *d.startLease, "")
	if err == nil && decided {
		_, err = Wake(d.nctx, e.cfg.Assets, d.run, d.rev, d.startLease.Waits[0], d.identity()+".stray."+strconv.FormatUint(d.seq, 10))
	}
	if err != nil {
		d.log.Warn().Err(err).Msg("cannot look at what the parked run waits for after a stray start task; the sweeper wakes it if it must")
	}
}

// awaitDecided reports whether the await a run is parked at (l, parked)
// can be decided now: every one of its waits committed (l.All), or one of
// them. committed, when not empty, names a wait known to be committed (it
// is not read again). The reads see every acknowledged write (a batch read
// on a single server, the stream leader's answer for each wait on a
// replicated bucket); a park on more than maxWaitsChecked waits is taken
// as decided unread (a wake costs a replay, a missed one the run).
func awaitDecided(ctx context.Context, steps *jetstream.KV, l state.Lease, committed string) (bool, error) {
	known := committed != "" && slices.Contains(l.Waits, committed)
	switch {
	case len(l.Waits) == 0:
		return false, nil
	case known && !l.All:
		return true, nil
	case len(l.Waits) > maxWaitsChecked:
		return true, nil
	}
	others := slices.DeleteFunc(slices.Clone(l.Waits), func(id string) bool { return known && id == committed })
	if len(others) == 0 {
		return true, nil
	}
	n := 0
	if steps.Replicated() {
		for _, id := range others {
			_, _, err := steps.Get(ctx, id)
			switch {
			case err == nil:
				n++
			case !errors.Is(err, jetstream.ErrNotFound):
				return false, err
			}
		}
	} else {
		found, err := steps.Last(ctx, others...)
		if err != nil {
			return false, err
		}
		n = len(found)
	}
	if l.All {
		return n == len(others), nil
	}
	return n > 0, nil
}

// storedTaskReplays reports whether a run task stored now on subject, the
// run task subject of a run parked as l says, will hand the body to a
// holder that sees every commit made so far: a wake not delivered yet, or
// one a holder is at. It will not when none is stored, when the one stored
// is the parked holder's own (acknowledged, or handed back because its
// last look found the await decided: its removal can lag behind), or a
// start task (stored after the park: a stray, dropped without a replay,
// startRole). The read asks the stream's leader.
func storedTaskReplays(ctx context.Context, assets *jetstream.Assets, l state.Lease, subject string) (bool, error) {
	seq, body, err := jetstream.PendingTask(ctx, assets.JS, subject)
	if err != nil || seq == 0 || seq == l.Seq {
		return false, err
	}
	t, err := state.DecodeTask(body)
	return err == nil && t.Wake, nil // a malformed task is terminated unread
}
