package workflow

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/state"
)

// settleRun carries out s on a run task's delivery d, whose holder is h
// (nil when the delivery ended before it took the lease).
func (e *Executor) settleRun(d *delivery, h *holder, s *settlement) {
	msg := d.msg.Msg
	switch s.kind {
	case settleFinish:
		run, err := e.finish(d.nctx, d.log, d.run, d.rev, s)
		if err == nil {
			err = e.notifyParent(d.nctx, run)
		}
		if errors.Is(err, jetstream.ErrNotFound) {
			// The record is gone: nothing is left to finish.
			d.log.Error().Err(err).Msg("run record gone; task dropped")
		} else if err != nil {
			e.settleRun(d, h, &settlement{kind: settleRelease, err: fmt.Errorf("cannot record the run's end: %w", err)})
			return
		}
		if hook := e.cfg.Hooks.AfterFinish; hook != nil {
			hook(d.run.RunID)
		}
		settleErr(d.log, msg.Ack(), "ack")
	case settlePark:
		e.park(d, h, s)
	case settleBlock:
		e.settleBlocked(d.nctx, d, h, s)
	case settleRelease:
		switch {
		case h != nil && s.handOver:
			h.lease.handOver(h.inherited)
		case h != nil:
			h.lease.release()
		}
		switch {
		case errors.Is(s.err, errWorkerStopping):
			d.log.Info().Msg("worker stopping: run handed over at a step boundary")
		case s.err != nil:
			d.log.Warn().Err(s.err).Msg("task released")
		}
		delay := e.cfg.ReleaseDelay
		if s.delay > 0 {
			delay = s.delay
		}
		if s.handOver {
			delay = max(delay, d.msg.HandBackDelay()) // to another worker
		}
		settleErr(d.log, msg.NakWithDelay(delay), "nak")
	case settleDrop:
		if s.warn {
			d.log.Warn().Err(s.err).Msg("task dropped")
		} else {
			d.log.Info().Err(s.err).Msg("task dropped")
		}
		settleErr(d.log, msg.Ack(), "ack")
	case settleStray:
		d.log.Info().Err(s.err).Msg("stray start task dropped")
		e.strayLook(d)
	case settleLost:
		// The message is another delivery's now: no ack, no nak, no more
		// heartbeats from here.
		d.msg.Stop()
		d.log.Warn().Err(s.err).Msg("run's lease lost to another delivery; leaving its task to it")
	default:
		d.log.Error().Int("settlement", int(s.kind)).Msg("unexpected settlement of a run task; releasing it")
		settleErr(d.log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
	}
}

// park leaves the run waiting for what s's await waits for: the lease is
// written parked (the holder's last write: nothing it does after commits;
// heartbeats keep the message, no longer the lease), and the holder looks
// at what it waits for once more, before it acknowledges the task. A
// commit that came after the await read the history found the lease not
// parked, so its committer left the wake to this holder (or its wake was
// absorbed by this task): the look sees it, and the task is handed back
// at once (nak) instead of acknowledged; its redelivery takes the parked
// run over and replays.
// Only when the look finds nothing is the task acknowledged, and its
// acknowledgement confirmed. A commit after the look finds the lease
// parked and wakes the run itself (Wake waits out this task while it is
// still stored, for up to absorbLag). So a holder that dies anywhere in
// park loses nothing: up to the acknowledgement its task is redelivered,
// and after it nothing is left for it to do — unless the look and the
// acknowledgement took so long (half of absorbLag or more) that a
// committer may have stopped waiting: then the holder looks once more
// after the acknowledgement and wakes the run if the await is decided.
func (e *Executor) park(d *delivery, h *holder, s *settlement) {
	if err := e.recordBuild(d); err != nil {
		e.settleRun(d, h, &settlement{kind: settleRelease, err: fmt.Errorf("cannot record the run's build: %w", err)})
		return
	}
	waits := stepIDs(s.waits)
	parked, err := h.lease.park(s.epoch, s.waits, s.begun, !s.first, s.began)
	if err != nil {
		if errors.Is(err, errLeaseLost) || errors.Is(err, errLeaseCancelled) {
			e.settleRun(d, h, lostOr(err))
			return
		}
		e.settleRun(d, h, &settlement{kind: settleRelease, err: fmt.Errorf("cannot park the run: %w", err)})
		return
	}
	msg := d.msg.Msg
	looked := time.Now()
	decided, err := e.lookAgain(d, s, parked)
	d.msg.Stop()
	switch {
	case err != nil:
		d.log.Warn().Err(err).Msg("cannot look again at what the parked run waits for; task handed back")
		settleErr(d.log, msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	case decided:
		settleErr(d.log, msg.Nak(), "nak")
		return
	}
	if hook := e.cfg.Hooks.BeforeParkAck; hook != nil {
		hook(d.run.RunID)
	}
	actx, cancel := context.WithTimeout(d.nctx, 10*time.Second)
	err = msg.DoubleAck(actx)
	cancel()
	if err != nil {
		// Redelivered after AckWait: its holder takes the parked run over.
		d.log.Warn().Err(err).Msg("cannot confirm the parked run's acknowledgement")
		return
	}
	if time.Since(looked) >= absorbLag/2 {
		decided, err := e.lookAgain(d, s, parked)
		if err == nil && decided {
			_, err = Wake(d.nctx, e.cfg.Assets, d.run, d.rev, s.waits[0].id, d.identity()+".look."+strconv.FormatUint(parked, 10))
		}
		if err != nil {
			d.log.Warn().Err(err).Msg("cannot look again at what the parked run waits for after a slow park; the sweeper wakes it")
		}
	}
	if hook := e.cfg.Hooks.AfterPark; hook != nil {
		hook(d.run.RunID, waits)
	}
}

// recordBuild records the worker's build as the build that started d's run
// if its record names none yet: the first holder to park the run (or to end
// it: finish) records it, before the park, so that every wake of a pinned
// run finds the build it must go to. A worker with no build records none.
func (e *Executor) recordBuild(d *delivery) error {
	if d.run.Build != "" || e.cfg.Build == "" {
		return nil
	}
	run, rev, written, err := e.runs.SetBuild(d.nctx, d.run, d.rev, e.cfg.Build)
	switch {
	case err != nil:
		return err
	case written:
		d.run, d.rev = run, rev
	default:
		d.run.Build = run.Build
	}
	return nil
}

// lookAgain reports whether the await that parked the run at lease
// revision parked (s) can be decided now: its first wait committed (s.first),
// or all of them. The read sees every write stored before it began: on a
// single server one batch read fenced at the park's revision; a
// replicated bucket's batch read may come from a lagging replica, so there
// the waits are read from the leader, one by one, until the answer is
// known.
func (e *Executor) lookAgain(d *delivery, s *settlement, parked uint64) (bool, error) {
	if len(s.waits) == 0 {
		return false, nil
	}
	committed := func(p *Pending) (bool, error) { rec, err := e.lookup(d, p.id); return rec != nil, err }
	if !e.cfg.Assets.Steps.Replicated() {
		hist, err := e.readFenced(d.nctx, d.identity(), parked)
		if err != nil {
			return false, err
		}
		hist.waive(d.run.Waived, d.run.WaivedRev)
		committed = func(p *Pending) (bool, error) { return hist.get(p.id) != nil, nil }
	}
	for _, p := range s.waits {
		ok, err := committed(p)
		if err != nil {
			return false, err
		}
		if ok == s.first {
			return s.first, nil // the first one committed, or one of all missing
		}
	}
	return !s.first, nil
}

// finish records the run's end with compare-and-set on the revision the
// delivery read; when that revision is stale (the record changed since) it
// reads the record and tries again. A run already in a terminal state, or
// a record that now holds another run under the same ID (another token or
// generation), is left as it is.
//
// It returns the record as it ended up.
func (e *Executor) finish(ctx context.Context, log zerolog.Logger, run state.Run, rev uint64, s *settlement) (state.Run, error) {
	run, written, err := e.runs.Finish(ctx, run, rev, func(run *state.Run) {
		run.UpdatedAt, run.Block = e.cfg.Now().UTC(), nil
		if run.Build == "" {
			run.Build = e.cfg.Build
		}
		switch {
		case s.err == nil && len(s.output) > state.MaxInputBytes:
			run.Status, run.Error = state.StatusFailed, &state.ErrorInfo{
				Message: fmt.Sprintf("workflow output of %d bytes is over the %d-byte limit", len(s.output), state.MaxInputBytes),
				Kind:    "output", Fatal: true,
			}
		case s.err == nil:
			run.Status, run.Output = state.StatusCompleted, s.output
		default:
			run.Status, run.Error = state.StatusFailed, errorInfo(s)
		}
		if _, err := state.Encode(*run); errors.Is(err, state.ErrInputTooLarge) {
			// Input and output together do not fit in one record.
			run.Status, run.Output = state.StatusFailed, nil
			run.Error = &state.ErrorInfo{Message: "workflow output too large to store: " + err.Error(), Kind: "output", Fatal: true}
		}
	})
	if err != nil || !written {
		return run, err
	}
	took := run.UpdatedAt.Sub(run.CreatedAt)
	e.cfg.Metrics.RunFinished(run.Workflow, string(run.Status), took)
	logRunEnd(log, run, took)
	e.cfg.Tracer.EndRun(run)
	return run, nil
}

// notifyParent hands the end of run, a child run, to its parent (see
// ParentNotifier); a run without a parent, or not ended, needs nothing.
func (e *Executor) notifyParent(ctx context.Context, run state.Run) error {
	if run.Parent == nil || !run.Status.Terminal() {
		return nil
	}
	return ParentNotifier{Assets: e.cfg.Assets, Runs: e.runs, Now: e.cfg.Now}.Notify(ctx, run)
}

// logRunEnd logs the end of run, which took took: a failure at warn level
// with the error's kind, code and message (a run that failed its input
// validation among them), a completion at debug level.
func logRunEnd(log zerolog.Logger, run state.Run, took time.Duration) {
	if run.Status != state.StatusFailed || run.Error == nil {
		log.Debug().Str("status", string(run.Status)).Str("took", logging.Duration(took)).Msg("run ended")
		return
	}
	ev := log.Warn().Str("status", string(run.Status)).Str("error_kind", run.Error.Kind).Str("error", run.Error.Message).
		Bool("fatal", run.Error.Fatal).Str("took", logging.Duration(took))
	if run.Error.Code != "" {
		ev = ev.Str("error_code", run.Error.Code)
	}
	ev.Msg("run failed")
}

func errorInfo(s *settlement) *state.ErrorInfo {
	var se *StepError
	switch {
	case s.panic:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "panic", Fatal: true}
	case errors.Is(s.err, ErrInput):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "input", Fatal: true}
	case errors.Is(s.err, ErrRerunSource):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "rerun", Fatal: true}
	case errors.As(s.err, &se):
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "step", Fatal: se.Fatal, Code: errorCode(s.err)}
	default:
		return &state.ErrorInfo{Message: s.err.Error(), Kind: "workflow", Fatal: isFatal(s.err), Code: errorCode(s.err)}
	}
}
