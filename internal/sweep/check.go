package sweep

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
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
// (its start subject, then its step subjects: a start task is replaced by
// step tasks, never the other way round, so this order cannot miss a task
// moving between them), a timer, or an awaited event.
func (s *Sweeper) busy(ctx context.Context, run Run, timers natsjs.Stream) (holder, error) {
	identity := run.Identity()
	start := jetstream.TaskSubject(run.Workflow, identity, "")
	for _, f := range []string{start, start + ".>"} {
		if has, err := hasMessages(ctx, s.cfg.Assets.Tasks, f); has || err != nil {
			return heldByTask, err
		}
	}
	if timers != nil {
		// jetflow.timer.<rest> and jetflow.due.<rest>, of the start task
		// and of the step tasks.
		anyTimer := "jetflow.*." + strings.TrimPrefix(start, "jetflow.task.")
		for _, f := range []string{anyTimer, anyTimer + ".>"} {
			has, err := hasMessages(ctx, timers, f)
			if errors.Is(err, natsjs.ErrStreamNotFound) {
				s.timers, err = nil, nil // deleted: no timers, looked up again next pass
				break
			}
			if has || err != nil {
				return heldByTimer, err
			}
		}
	}
	if s.cfg.AwaitsEvent != nil {
		if waits, err := s.cfg.AwaitsEvent(ctx, run); waits || err != nil {
			return heldByEvent, err
		}
	}
	return heldByNothing, nil
}

// hasMessages asks a stream how many messages it holds on the subjects
// matching filter: one stream-info request with a subject filter, which
// the server answers from its subject index without reading messages.
func hasMessages(ctx context.Context, st natsjs.Stream, filter string) (bool, error) {
	info, err := st.Info(ctx, natsjs.WithSubjectFilter(filter))
	if err != nil {
		return false, fmt.Errorf("sweep: stream info %s: %w", filter, err)
	}
	for _, n := range info.State.Subjects {
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// dispatch is what redispatch did.
type dispatch int

const (
	// dispatchChanged: the record changed since it was read (or is gone);
	// nothing was published.
	dispatchChanged dispatch = iota
	// dispatchStored: the start task was stored.
	dispatchStored
	// dispatchAbsorbed: the start task was absorbed, by another sweeper's
	// (same message ID) or by a start task pending after all.
	dispatchAbsorbed
)

// redispatch reads t's record again and, if it is still the same running
// revision, publishes its start task again.
func (s *Sweeper) redispatch(ctx context.Context, t *tracked, now time.Time) (dispatch, error) {
	run, rev, err := s.store.Get(ctx, t.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		delete(s.runs, t.RunID)
		return dispatchChanged, nil
	}
	if err != nil {
		return dispatchChanged, err
	}
	if run.Status != state.StatusRunning || !s.served[run.Workflow] {
		delete(s.runs, t.RunID) // ended meanwhile (or another run now)
		return dispatchChanged, nil
	}
	if rev != t.Revision {
		// Written since it was read (a new generation): checked again as
		// this revision, StuckAfter from now.
		t.Run = Run{RunID: run.RunID, Workflow: run.Workflow, Generation: run.Generation, Revision: rev}
		return dispatchChanged, nil
	}
	b, err := state.Encode(state.Task{
		V: state.Version, RunID: run.RunID, Workflow: run.Workflow, Input: run.Input, Token: run.Token,
		Source: run.Source, Fingerprint: run.Fingerprint, CreatedAt: run.CreatedAt,
		Generation: run.Generation, Retention: run.Retention, Redispatched: true, TraceParent: run.TraceParent,
	})
	if err != nil {
		return dispatchChanged, err
	}
	identity := t.Identity()
	msgID := identity + ".sweep." + strconv.FormatUint(rev, 10) + "." +
		strconv.FormatInt(now.UnixNano()/int64(s.cfg.StuckAfter), 10)
	d, err := jetstream.PublishTask(ctx, s.cfg.Assets.JS, jetstream.TaskSubject(run.Workflow, identity, ""), msgID, b)
	if err != nil {
		return dispatchChanged, fmt.Errorf("sweep: dispatch run %s again: %w", run.RunID, err)
	}
	log := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Str("run_id", run.RunID).Str("workflow", run.Workflow).Int("generation", run.Generation).
			Uint64("revision", rev).Time("created_at", run.CreatedAt).Str("dispatch", d.String())
	}
	if d != jetstream.Stored {
		log(s.log.Info()).Msg("run stuck, but its start task was already dispatched again (another sweeper) or is pending")
		return dispatchAbsorbed, nil
	}
	s.cfg.Metrics.RunStuck(run.Workflow)
	log(s.log.Warn()).Msg("run stuck: running with no pending task, timer or awaited event; start task published again")
	return dispatchStored, nil
}
