package workflow

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// A run whose body diverges from its history is blocked: it runs nothing
// more, its record says blocked with the divergence report
// (state.Run.Block), and a recheck timer wakes it later, so that a worker
// whose code replays the history (a rollback, a fixed deploy) takes it and
// it goes on by itself. Nothing of the run is lost: the holder that found
// the divergence began nothing at the await where it found it, and its
// lease is left so that the next holder begins every await again.
//
// The run goes on (unblock) as soon as a holder's replay passes the place
// the block names without diverging; an operator can also unblock it
// (Unblocker), retrying the current code or waiving the history's step.

// blockStep is the name of the pseudo step a blocked run's recheck timer is
// stored under (its step ID <identity>.block=divergence.0): the name has
// an "=", so no step the body names collides with it.
const blockStep = "block=divergence"

// DefaultBlockRecheck is how long after a block its first recheck comes
// (Config.BlockRecheck); later rechecks come as long after the last as the
// run has been blocked, up to blockRecheckMax.
const DefaultBlockRecheck = time.Minute

// blockRecheckMax bounds the time between two rechecks of a blocked run.
const blockRecheckMax = time.Hour

// blocked is the settlement of a body that diverged (inc: what the replay
// found), with the report of a replay check of the whole body.
func (c *Context) blocked(inc *jetflowtype.Divergence) *settlement {
	return &settlement{kind: settleBlock, divergence: c.report(inc)}
}

// block blocks d's run with s's divergence report: a recheck timer
// stored first (the run's liveness: a blocked run always holds one), then
// the run record written blocked (unless it already is, at the same
// place), then the holder's lease (h; nil for a branch task) left for the
// next holder to begin every await again. The caller acknowledges the
// task. It returns an error when something could not be written; the task
// is then released and its redelivery blocks again.
func (e *Executor) block(d *delivery, h *holder, s *settlement) error {
	div := s.divergence
	since := e.cfg.Now().UTC()
	if d.run.Status == state.StatusBlocked && d.run.Block != nil {
		since = d.run.Block.Since
	}
	if err := e.storeRecheck(d, since); err != nil {
		return err
	}
	block := jetflowtype.RunBlock{Reason: jetflowtype.BlockDivergence, Divergence: div, Build: e.cfg.Build, Worker: e.cfg.WorkerID, Since: since}
	run, written, err := e.runs.Block(d.nctx, d.run, d.rev, block)
	if err != nil {
		return fmt.Errorf("cannot record the run blocked: %w", err)
	}
	if written {
		e.cfg.Metrics.RunBlocked(run.Workflow, string(div.Kind))
		d.log.Warn().Str("build", e.cfg.Build).Str("divergence", string(div.Kind)).Int("position", div.Position).
			Str("history_step", div.History.String()).Str("code_step", div.Code.String()).Str("detail", div.Detail).
			Msg("run blocked: its code diverges from its history; no step runs until compatible code takes it or an operator unblocks it")
	}
	if h != nil {
		h.lease.leave()
	}
	return nil
}

// storeRecheck stores the timer that wakes d's run, blocked since since,
// again: after Config.BlockRecheck at first, then after as long as the run
// has been blocked, at most blockRecheckMax. The wake names no step, so its
// holder begins every await again (a branch task a branch's block left
// undone is published again).
func (e *Executor) storeRecheck(d *delivery, since time.Time) error {
	now := e.cfg.TimerNow()
	wait := min(max(e.cfg.BlockRecheck, now.Sub(since)), blockRecheckMax)
	due := now.Add(wait)
	id := state.StepID(d.identity(), blockStep, 0)
	t := state.StepTask(d.run, d.rev, "")
	t.Wake = true
	if err := e.storeTimer(d, jetstream.RunTimer(d.run.Workflow, id), id+"#"+strconv.FormatInt(due.Unix(), 10), t, due); err != nil {
		return fmt.Errorf("cannot store the blocked run's recheck: %w", err)
	}
	return nil
}

// unblock makes the blocked run of the holder's delivery running again,
// once the body has gone past the place its block names (c.seq: the
// places started so far) without diverging. A run that is not blocked
// costs nothing.
func (h *holder) unblock(c *Context) *settlement {
	run := h.d.run
	if run.Status != state.StatusBlocked {
		return nil
	}
	if b := run.Block; b != nil && b.Divergence != nil && c.seq <= b.Divergence.Position {
		return nil
	}
	return h.e.resumeBlocked(h.d, "replayed past the place it was blocked at")
}

// resumeBlocked writes d's blocked run running again (why: for the log).
func (e *Executor) resumeBlocked(d *delivery, why string) *settlement {
	run, rev, written, err := e.runs.Unblock(d.nctx, d.run, d.rev, nil)
	if err != nil {
		return &settlement{kind: settleRelease, err: fmt.Errorf("cannot record the run unblocked: %w", err)}
	}
	switch {
	case written:
		d.log.Info().Str("build", e.cfg.Build).Msg("blocked run goes on: " + why)
		d.run, d.rev = run, rev
	case run.Token == d.run.Token && run.Generation == d.run.Generation:
		// Unblocked (or ended) by another writer meanwhile.
		d.run.Status, d.run.Block = run.Status, run.Block
	}
	return nil
}

// errBlocked is the cause of a settlement that blocked the run.
var errBlocked = errors.New("jetflow: the run's code diverges from its history: run blocked")

// settleBlocked blocks d's run (block) and acknowledges its task, or
// releases the task when the block could not be written.
func (e *Executor) settleBlocked(ctx context.Context, d *delivery, h *holder, s *settlement) {
	if err := e.block(d, h, s); err != nil {
		if h != nil {
			h.lease.release()
		}
		d.log.Warn().Err(err).Msg("task released")
		settleErr(d.log, d.msg.Msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	d.msg.Stop()
	settleErr(d.log, d.msg.Msg.Ack(), "ack")
}
