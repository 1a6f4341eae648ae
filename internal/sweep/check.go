package sweep

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// bindTimers returns JETFLOW_TIMERS, or nil when it does not exist (looked
// up again at the next pass).
func (s *Sweeper) bindTimers(ctx context.Context) natsjs.Stream {
	if s.timers != nil {
		return s.timers
	}
	st, err := s.cfg.Assets.JS.Stream(ctx, TimersStream)
	if err != nil {
		if !errors.Is(err, natsjs.ErrStreamNotFound) {
			s.log.Debug().Err(err).Msg("cannot look up the timers stream")
		}
		return nil
	}
	s.timers = st
	return st
}

// holder is what a check found will advance a run.
type holder int

const (
	heldByNothing holder = iota
	heldByTask
	// heldByTimer: a timer (a retry's backoff, a sleep, a wait's timeout
	// or recheck) that the server publishes when due.
	heldByTimer
	heldByEvent
)

// busy reports what run has that will advance it: a task in JETFLOW_TASKS
// (its run task, or a branch task), a timer, or an awaited event. The run
// task is looked at first: a holder publishes a run's branch tasks before
// it acknowledges its run task, so this order cannot miss a run moving
// from one to the other.
func (s *Sweeper) busy(ctx context.Context, run Run, timers natsjs.Stream) (holder, error) {
	identity := run.Identity()
	tasks := []string{jetstream.RunSubject(run.Workflow, identity), jetstream.BranchSubject(run.Workflow, identity) + ".>"}
	if has, err := jetstream.HasMessages(ctx, s.cfg.Assets.Tasks, tasks...); has || err != nil {
		return heldByTask, err
	}
	if timers != nil {
		has, err := jetstream.HasMessages(ctx, timers, jetstream.RunTimersFilters(run.Workflow, identity)...)
		if errors.Is(err, natsjs.ErrStreamNotFound) {
			s.timers, err = nil, nil // deleted: no timers, looked up again next pass
		}
		if has || err != nil {
			return heldByTimer, err
		}
	}
	if s.cfg.AwaitsEvent != nil {
		if waits, err := s.cfg.AwaitsEvent(ctx, run); waits || err != nil {
			return heldByEvent, err
		}
	}
	return heldByNothing, nil
}

// dispatch is what redispatch did.
type dispatch int

const (
	// dispatchChanged: the record changed since it was read (or is gone);
	// nothing was published.
	dispatchChanged dispatch = iota
	// dispatchStored: the run's wake was stored.
	dispatchStored
	// dispatchAbsorbed: the wake was absorbed, by another sweeper's (same
	// message ID) or by a run task pending after all.
	dispatchAbsorbed
)

// offerBlocked wakes t, a run that another build's code blocked, once for
// this worker's build: the holder that takes the wake replays the run with
// whatever code it has, and the run goes on if that code replays its
// history (or blocks again, at no cost but the replay). The message ID
// names the build and the record's revision, so the sweepers of several
// workers of one build store one wake.
func (s *Sweeper) offerBlocked(ctx context.Context, t *tracked) error {
	run, rev, err := s.store.Get(ctx, t.RunID)
	if err != nil {
		return err
	}
	if run.Status != state.StatusBlocked {
		t.offered = t.Revision
		return nil
	}
	build := s.cfg.Build
	if build == "" {
		build = "none"
	}
	msgID := t.Identity() + ".unblock." + build + "." + strconv.FormatUint(rev, 10)
	if _, err := workflow.Wake(ctx, s.cfg.Assets, run, rev, "", msgID); err != nil {
		return fmt.Errorf("sweep: wake blocked run %s: %w", run.RunID, err)
	}
	t.offered = t.Revision // offered: not again at this revision
	s.log.Info().Str("run_id", run.RunID).Str("workflow", run.Workflow).Str("blocked_by", t.BlockedBy).
		Msg("blocked run offered to this worker's build")
	return nil
}

// redispatch reads t's record again and, if it is still the same running
// revision, wakes the run (workflow.Wake).
func (s *Sweeper) redispatch(ctx context.Context, t *tracked, now time.Time) (dispatch, error) {
	run, rev, err := s.store.Get(ctx, t.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		delete(s.runs, t.RunID)
		return dispatchChanged, nil
	}
	if err != nil {
		return dispatchChanged, err
	}
	if !run.Status.Active() || !s.served[run.Workflow] {
		delete(s.runs, t.RunID) // ended meanwhile (or another run now)
		return dispatchChanged, nil
	}
	if rev != t.Revision {
		// Written since it was read (a new generation): checked again as
		// this revision, StuckAfter from now.
		t.Run = Run{RunID: run.RunID, Workflow: run.Workflow, Generation: run.Generation, Revision: rev}
		return dispatchChanged, nil
	}
	msgID := t.Identity() + ".sweep." + strconv.FormatUint(rev, 10) + "." +
		strconv.FormatInt(now.UnixNano()/int64(s.cfg.StuckAfter), 10)
	d, err := workflow.Wake(ctx, s.cfg.Assets, run, rev, "", msgID)
	if err != nil {
		return dispatchChanged, fmt.Errorf("sweep: wake run %s: %w", run.RunID, err)
	}
	log := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Str("run_id", run.RunID).Str("workflow", run.Workflow).Int("generation", run.Generation).
			Uint64("revision", rev).Time("created_at", run.CreatedAt).Str("dispatch", d.String())
	}
	if d != jetstream.Stored {
		log(s.log.Info()).Msg("run stuck, but it was already woken again (another sweeper) or a task of it is pending")
		return dispatchAbsorbed, nil
	}
	s.cfg.Metrics.RunStuck(run.Workflow)
	log(s.log.Warn()).Msg("run stuck: running with no pending task, timer or awaited event; woken again")
	return dispatchStored, nil
}
