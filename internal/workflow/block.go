package workflow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
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

// settleBlocked blocks d's run (block) and settles its task: a run task
// is acknowledged (the run's recheck timer, and whoever unblocks it, wake
// it); a branch task is handed back as unstarted, after BlockRecheck, so
// that the branch stays stored for code that replays the run (a holder
// that begins the branch again meanwhile is absorbed by it, where a
// branch task published anew under its step ID within the broker's
// duplicate window would be dropped). A block that could not be written
// releases the task: its redelivery blocks again.
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
	if h == nil {
		settleErr(d.log, e.release(d.msg.Msg, e.cfg.BlockRecheck), "nak")
		return
	}
	settleErr(d.log, d.msg.Msg.Ack(), "ack")
}

// ErrRunNotBlocked: an unblock of a run that is not blocked.
var ErrRunNotBlocked = errors.New("jetflow: run is not blocked")

// ErrNothingToWaive: an unblock that accepts a divergence whose report
// names no step of the history to go on without (the input no longer
// decodes, the body panicked or never returns): only compatible code
// moves such a run on.
var ErrNothingToWaive = errors.New("jetflow: the divergence names no step of the history to waive")

// Unblock makes the blocked run runID go on (an operator's call): its
// record is written running again (compare-and-set) and a worker is asked
// to wake it (a branch task of its block's pseudo step, which any worker
// of the workflow turns into a wake: a task the operator's least-privilege
// user may publish). The holder that takes the wake replays the run with
// its code: a body that still diverges blocks it again.
//
// accept: the operator accepts the divergence the block reports: the
// history's step at its place (or, for a step the code starts out of
// place, that step's record) is waived (state.Run.Waived), so the code's
// step at that place runs, again: its side effect may repeat. A report
// without such a step is ErrNothingToWaive.
//
// It returns the record as it ended up and the step waived (""). A run
// that is not blocked is ErrRunNotBlocked with its record (a repeat call
// after a successful one gets it, as the run is running again), an unknown
// one ErrRunNotFound.
func Unblock(ctx context.Context, assets *jetstream.Assets, store *runs.Store, runID string, accept bool) (state.Run, string, error) {
	for round := 0; ; round++ {
		run, rev, err := store.Get(ctx, runID)
		if errors.Is(err, runs.ErrNotFound) {
			return state.Run{}, "", fmt.Errorf("%w: %s", ErrRunNotFound, runID)
		}
		if err != nil {
			return state.Run{}, "", err
		}
		if run.Status != state.StatusBlocked || run.Block == nil {
			return run, "", fmt.Errorf("%w: %s is %s", ErrRunNotBlocked, runID, run.Status)
		}
		seen := run.Block.Divergence
		waive, waiveRev := "", uint64(0)
		if accept {
			if waive = waivable(seen); waive == "" {
				return run, "", fmt.Errorf("%w: %s", ErrNothingToWaive, seen)
			}
			// Only the record the report is about is waived, at the
			// revision it has now: a record the code commits under that
			// step ID afterwards counts (none: a step the run waits for).
			if _, waiveRev, err = assets.Steps.Get(ctx, waive); err != nil && !errors.Is(err, jetstream.ErrNotFound) {
				return run, "", err
			}
		}
		run, rev, written, err := store.Unblock(ctx, run, rev, func(r *state.Run) bool {
			if r.Block == nil || !runs.SameDivergence(r.Block.Divergence, seen) {
				return false // blocked again elsewhere meanwhile: decide on the new report
			}
			if waive != "" {
				if !slices.Contains(r.Waived, waive) {
					r.Waived = append(r.Waived, waive)
				}
				if r.WaivedRev == nil {
					r.WaivedRev = map[string]uint64{}
				}
				r.WaivedRev[waive] = waiveRev
			}
			return true
		})
		switch {
		case err != nil:
			return run, "", err
		case !written && run.Status == state.StatusBlocked && round < 3:
			continue // the report changed under the call
		case !written:
			return run, "", fmt.Errorf("%w: %s is %s", ErrRunNotBlocked, runID, run.Status)
		}
		id := state.StepID(state.RunIdentity(run.RunID, run.Generation), blockStep, 0)
		b, err := state.Encode(state.StepTask(run, rev, id))
		if err == nil {
			_, err = jetstream.PublishTask(ctx, assets.JS, jetstream.BranchSubject(run.Workflow, id), id+".unblock."+strconv.FormatUint(rev, 10), b)
		}
		if err != nil {
			// The run is running again; its recheck timer wakes it.
			return run, waive, fmt.Errorf("jetflow: unblocked run %s, but could not wake it (its recheck timer will): %w", runID, err)
		}
		return run, waive, nil
	}
}

// waivable is the step of the history that d's report says the code
// departs from: the history's step at the place, or the code's own step
// the history holds elsewhere; "" for none.
func waivable(d *jetflowtype.Divergence) string {
	switch {
	case d.History != nil:
		return d.History.StepID
	case d.Kind == jetflowtype.DivergenceReordered && d.Code != nil:
		return d.Code.StepID
	}
	return ""
}

// isBlockPoke reports whether t is the branch task Unblock publishes: a
// request to wake the run, not a step to run.
func isBlockPoke(t state.Task) bool { return state.StepName(t.StepID) == blockStep }

// wakeUnblocked turns an unblock's branch task d into a wake of its run.
func (e *Executor) wakeUnblocked(d *delivery) {
	run, rev, err := e.runs.Get(d.nctx, d.task.RunID)
	if err == nil && run.Status.Active() && run.Generation == d.task.Generation {
		_, err = Wake(d.nctx, e.cfg.Assets, run, rev, "", d.identity()+".unblocked."+strconv.FormatUint(rev, 10))
	}
	if err != nil && !errors.Is(err, runs.ErrNotFound) {
		d.log.Warn().Err(err).Msg("cannot wake the unblocked run; releasing")
		settleErr(d.log, d.msg.Msg.NakWithDelay(e.cfg.ReleaseDelay), "nak")
		return
	}
	settleErr(d.log, d.msg.Msg.Ack(), "ack")
}

// notNewHere hands back d's task when it would start a new run (one whose
// record names no build yet) of a pinned workflow on a worker whose build a
// newer one superseded (Config.NewRuns): the run is pinned to the build of
// whoever takes it first, which must be the newest.
func (e *Executor) notNewHere(d *delivery, def Definition) bool {
	if !def.Pinned || d.run.Build != "" || d.task.Wake || d.delivered > 1 || e.cfg.NewRuns == nil || e.cfg.NewRuns(def.Name) {
		return false // not the first delivery of a start: the run may be under way here
	}
	return e.elsewhere(d, def, "(a newer build)")
}

// pinnedElsewhere reports the build a run of the pinned workflow def that
// names no build yet (it has not parked) was started on, when the history
// h says it is another than this worker's: the build of its first
// committed step (of a rerun, the first it committed itself). Such a run was taken up again before its first park (a
// drain's hand-over, a crash), and goes back to its build. "" otherwise.
func (e *Executor) pinnedElsewhere(def Definition, d *delivery, h *history) string {
	if !def.Pinned || d.run.Build != "" {
		return ""
	}
	first := -1
	build := ""
	from := 0 // a rerun's records before its source step are the source's, committed by its build
	if d.run.Rerun != nil {
		from = d.run.Rerun.Before
	}
	for _, rec := range h.steps {
		if placed(rec) && rec.Seq >= from && rec.Build != "" && (first < 0 || rec.Seq < first) {
			first, build = rec.Seq, rec.Build
		}
	}
	if build == e.cfg.Build {
		return ""
	}
	return build
}

// bounceDelay is how long a task handed back to build waits. The
// ceiling doubles from 100ms with each delivery, up to 1s while a live
// worker of build serves the workflow (the broker hands the task to
// another waiting pull request each time, so a few bounces reach it) and
// up to 5s otherwise (a build no worker runs now costs a delivery every
// 5s, not a loop). The delay is drawn from the ceiling's upper half: the
// broker hands a due message to the oldest waiting pull request, and an
// idle worker renews its request once per request life (a second), so a
// fixed delay that is a multiple of it would hand the task back at the
// same phase, to the same worker of the wrong build, every time.
func (e *Executor) bounceDelay(d *delivery, build string) time.Duration {
	limit := 5 * time.Second
	if e.cfg.BuildLive != nil && e.cfg.BuildLive(d.task.Workflow, build) {
		limit = time.Second
	}
	ceiling := min(100*time.Millisecond<<min(max(d.delivered-1, 0), 6), limit)
	return ceiling/2 + rand.N(ceiling/2+1)
}

// elsewhere hands d's task back, untouched, when it belongs to a run of a
// pinned workflow (def) that another build than this worker's started
// (build: the run's, or the branch task's): a worker of that build takes
// it, after bounceDelay. It reports whether it handed the task back.
func (e *Executor) elsewhere(d *delivery, def Definition, build string) bool {
	if !def.Pinned || build == "" || build == e.cfg.Build {
		return false
	}
	d.log.Debug().Str("build", build).Str("this_build", e.cfg.Build).Msg("task of a run pinned to another build: handed back")
	// Handed back as a delivery that started nothing (release): the
	// delivery of the right build counts no attempt for this one.
	settleErr(d.log, e.release(d.msg.Msg, e.bounceDelay(d, build)), "nak")
	return true
}
