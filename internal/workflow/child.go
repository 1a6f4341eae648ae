package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// ChildSpec is a child run a workflow body starts (Context.StartChild).
type ChildSpec struct {
	Workflow string
	Input    []byte
	// RunID names the child; empty derives it from the parent's step
	// (state.ChildRunID).
	RunID string
	// Detached: the child is not cancelled with its parent.
	Detached bool
}

// Error kinds of a parent's child step whose child did not complete.
const (
	// KindChildFailed: the child run failed.
	KindChildFailed = "child"
	// KindChildCancelled: the child run was cancelled.
	KindChildCancelled = "child-cancelled"
	// KindChildRefused: the child could not be started (its run ID holds
	// another workflow's run or another input, or its workflow is unknown).
	KindChildRefused = "child-refused"
)

// ParentNotifier tells parents that their children ended. It is what the
// executor and a client cancelling a child share.
type ParentNotifier struct {
	Assets *jetstream.Assets
	Runs   *runs.Store
	Now    func() time.Time
	// ViaBranch wakes the parent through a worker: a branch task of the
	// parent's child step, which finds the step committed and wakes the
	// run (handleBranch). A client sets it: run tasks, which also start
	// runs, are the workers' to publish (deploy/nats/accounts.conf).
	ViaBranch bool
}

// Notify commits the parent's step that stands for child, which has
// ended, with the child's outcome, and wakes the parent (Wake, or a
// branch task that does: ViaBranch). A repeat
// call commits nothing new (the step record is written with
// create-if-absent: the first outcome stays) and wakes the parent again (a
// wake absorbed by a pending one, or one more replay). A child without a
// parent, or whose parent has ended, wakes nobody.
func (n ParentNotifier) Notify(ctx context.Context, child state.Run) error {
	p := child.Parent
	if p == nil || !child.Status.Terminal() {
		return nil
	}
	rec := childStep(child, n.Now().UTC())
	b, err := state.Encode(rec)
	if err != nil {
		return err
	}
	if _, err := n.Assets.Steps.Create(ctx, p.StepID, b); err != nil && !errors.Is(err, jetstream.ErrExists) {
		return fmt.Errorf("jetflow: commit child %s in parent %s: %w", child.RunID, p.RunID, err)
	}
	parent, rev, err := n.Runs.Get(ctx, p.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if parent.Token != p.Token || parent.Generation != p.Generation {
		return nil
	}
	if parent.Status.Terminal() {
		// The parent has ended: nothing to resume. Should it be a child
		// whose own end was never told (a cancel that failed half-way),
		// tell its parent now.
		return n.Notify(ctx, parent)
	}
	if n.ViaBranch {
		// Its message ID is not the wake's: the stream would take the
		// wake the worker publishes for a duplicate of it.
		t := state.StepTask(parent, rev, p.StepID)
		t.Redispatched = true
		b, err := state.Encode(t)
		if err == nil {
			_, err = jetstream.PublishTask(ctx, n.Assets.JS, jetstream.BranchSubject(parent.Workflow, p.StepID), p.StepID+".notify", b)
		}
		return err
	}
	_, err = Wake(ctx, n.Assets, parent, rev, p.StepID, p.StepID+".wake")
	return err
}

// childStep is the record of the parent's step that stands for the ended
// run child: its output, or its failure as a fatal step error.
func childStep(child state.Run, now time.Time) state.Step {
	p := child.Parent
	rec := state.Step{
		V: state.Version, StepID: p.StepID, RunID: p.RunID, Name: state.StepName(p.StepID), Seq: p.Seq, Attempt: 1,
		Committed: now, Child: child.RunID,
	}
	switch child.Status {
	case state.StatusCompleted:
		rec.Output = child.Output
	case state.StatusCancelled:
		rec.Error = &state.ErrorInfo{Kind: KindChildCancelled, Fatal: true, Message: fmt.Sprintf("child run %s was cancelled", child.RunID)}
	default:
		msg, code := "failed", ""
		if child.Error != nil {
			msg, code = child.Error.Message, child.Error.Code
		}
		rec.Error = &state.ErrorInfo{Kind: KindChildFailed, Fatal: true, Code: code, Message: fmt.Sprintf("child run %s failed: %s", child.RunID, msg)}
	}
	return rec
}

// beginChild begins the child step p: it starts the child run (startChild)
// and gives p its record when the child has already ended or could not be
// started. While the child runs, a recheck timer of p is stored: it tells
// the sweeper that the run waits, and wakes the run should the child's
// end not. The holder woken by that recheck begins the child again, which
// finds it (ended, or running: the next recheck is stored).
func (h *holder) beginChild(c *Context, p *Pending) *settlement {
	rec, s := h.e.startChild(h.d, p.call)
	if s != nil {
		return s
	}
	if rec != nil {
		p.rec = rec
		c.hist.put(rec)
		return nil
	}
	now := h.e.cfg.TimerNow()
	if _, err := h.markWait(p, state.Wait{Kind: state.WaitChild, Child: p.call.child.RunID, Since: now}); err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	if err := h.scheduleWake(c, p, time.Time{}, now); err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	return nil
}

// startChild starts the child run of child step sc: it records the child
// on its parent's record, admits the child run and returns the step's
// record when the child has already ended (nil while it runs: its end
// commits the step and wakes the parent). A child the parent may no longer
// start (the parent ended) is a drop settlement; a NATS failure a release.
// A repeat call for the same step finds the link and the child's run.
func (e *Executor) startChild(d *delivery, sc *stepCall) (*state.Step, *settlement) {
	spec := sc.child
	link := state.ChildLink{RunID: spec.RunID, Workflow: spec.Workflow, StepID: sc.id, Detached: spec.Detached}
	parent, _, err := e.runs.Update(d.nctx, d.run.RunID, func(r *state.Run) (bool, error) {
		if r.Status.Terminal() || r.Token != d.run.Token || r.Generation != d.run.Generation {
			return false, nil
		}
		for _, c := range r.Children {
			if c.RunID == link.RunID {
				return false, nil
			}
		}
		r.Children = append(r.Children, link)
		return true, nil
	})
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	if parent.Token != d.run.Token || parent.Generation != d.run.Generation {
		// An earlier delivery may have admitted the child of this
		// generation and died before it saw the generation replaced.
		if s := e.cancelOrphan(d, spec); s != nil {
			return nil, s
		}
		return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: the run ID holds another run now", errRunNotRunning)}
	}
	if parent.Status.Terminal() {
		// An earlier delivery may have admitted the child after the
		// parent's cancel read its children, and died before it could
		// cancel it: cancel it now.
		if s := e.cancelChildOf(d, parent, spec); s != nil {
			return nil, s
		}
		return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: the run ended before its child %s started", errNotThisTask, spec.RunID)}
	}
	if known, err := e.knownWorkflow(d.nctx, spec.Workflow); err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	} else if !known {
		return e.commitRecord(d, refusedChild(d, sc, fmt.Sprintf("workflow %q is not registered by any worker", spec.Workflow)))
	}
	if h := e.cfg.Hooks.BeforeChildAdmit; h != nil {
		h(sc.id, spec.RunID)
	}
	res, err := e.cfg.Admitter.Admit(e.cfg.Tracer.RunContext(d.nctx, &d.run), dedupe.Request{
		RunID: spec.RunID, Workflow: spec.Workflow, Input: spec.Input, Source: "run " + d.run.RunID,
		Entry: string(metrics.EntryChild),
		Parent: &state.ParentLink{
			RunID: d.run.RunID, Workflow: d.run.Workflow, Token: d.run.Token, Generation: d.run.Generation,
			StepID: sc.id, Seq: sc.seq, Detached: spec.Detached,
		},
	})
	var refused *dedupe.ConflictError
	switch {
	case errors.As(err, &refused) || errors.Is(err, jetflowtype.ErrIdempotencyConflict) || errors.Is(err, state.ErrInvalidRunID) ||
		errors.Is(err, state.ErrInputTooLarge):
		return e.commitRecord(d, refusedChild(d, sc, err.Error()))
	case err != nil:
		return nil, &settlement{kind: settleRelease, err: err}
	}
	child := res.Run
	if p := child.Parent; p == nil || p.StepID != sc.id || p.Token != d.run.Token || p.Generation != d.run.Generation {
		// The run ID holds a run that is not this step's child (started
		// from outside, or by another parent): refuse it rather than wait
		// for an end that would never resume this parent.
		return e.commitRecord(d, refusedChild(d, sc, fmt.Sprintf("run %s exists and is not a child of this step", spec.RunID)))
	}
	if h := e.cfg.Hooks.AfterChildStart; h != nil {
		h(sc.id, spec.RunID)
	}
	if !spec.Detached {
		// A cancel of the parent, or of its generation by a superseding
		// start, that read its children before the link was written has
		// missed this child: cancel it here.
		p, _, err := e.runs.Get(d.nctx, d.run.RunID)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		if p.Token != d.run.Token || p.Generation != d.run.Generation || p.Status == state.StatusCancelled {
			if s := e.cancelChild(d, spec.RunID); s != nil {
				return nil, s
			}
			return nil, &settlement{kind: settleDrop, err: fmt.Errorf("%w: the run was cancelled or replaced while its child %s started", errNotThisTask, spec.RunID)}
		}
	}
	if !child.Status.Terminal() {
		return nil, nil
	}
	rec := childStep(child, e.cfg.Now().UTC())
	rec.Seq, rec.Worker = sc.seq, e.cfg.WorkerID
	return e.commitRecord(d, &rec)
}

// knownWorkflow reports whether some worker of the deployment registers
// workflow: this one (which announces it only after its first fetches), or
// one the roster knows.
func (e *Executor) knownWorkflow(ctx context.Context, workflow string) (bool, error) {
	if _, ok := e.cfg.Definitions[workflow]; ok {
		return true, nil
	}
	_, known, err := roster.Lookup(ctx, e.cfg.Assets.Workflows, workflow)
	return known, err
}

// cancelChildOf cancels the attached child spec of parent, which was
// cancelled, when parent's record links it; a child that was never
// admitted is nothing to cancel. It returns a release settlement when the
// cancel cannot be written.
func (e *Executor) cancelChildOf(d *delivery, parent state.Run, spec *ChildSpec) *settlement {
	if parent.Status != state.StatusCancelled || spec.Detached {
		return nil
	}
	for _, c := range parent.Children {
		if c.RunID != spec.RunID {
			continue
		}
		if s := e.cancelChild(d, spec.RunID); s != nil {
			return s
		}
	}
	return nil
}

// cancelChild cancels the child run runID, if it still runs, as any
// cancel does (Canceller.Cancel: its workers, its children). A child
// that has no record or has ended is nothing to do; a cancel that fails
// releases the task, and its redelivery repeats it.
func (e *Executor) cancelChild(d *delivery, runID string) *settlement {
	_, err := e.cancels.Cancel(d.nctx, runID)
	if err != nil && !errors.Is(err, ErrRunNotFound) && !errors.Is(err, ErrRunEnded) {
		return &settlement{kind: settleRelease, err: err}
	}
	return nil
}

// cancelOrphan cancels the attached child spec of d's generation, when it
// was admitted, after that generation was replaced by another run under
// the same run ID. A child that does not exist, is detached, or belongs
// to another parent or generation is left alone.
func (e *Executor) cancelOrphan(d *delivery, spec *ChildSpec) *settlement {
	if spec.Detached {
		return nil
	}
	child, _, err := e.runs.Get(d.nctx, spec.RunID)
	switch {
	case errors.Is(err, runs.ErrNotFound):
		return nil
	case err != nil:
		return &settlement{kind: settleRelease, err: err}
	}
	if p := child.Parent; p == nil || p.RunID != d.run.RunID || p.Token != d.run.Token || p.Generation != d.run.Generation {
		return nil
	}
	return e.cancelChild(d, spec.RunID)
}

// refusedChild is the record of child step sc whose child could not be
// started, for the reason why.
func refusedChild(d *delivery, sc *stepCall, why string) *state.Step {
	return &state.Step{
		V: state.Version, StepID: sc.id, RunID: d.run.RunID, Name: sc.name, Seq: sc.seq, Attempt: 1, Child: sc.child.RunID,
		Error: &state.ErrorInfo{Kind: KindChildRefused, Fatal: true, Message: "child not started: " + why},
	}
}
