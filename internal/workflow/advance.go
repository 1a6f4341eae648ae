package workflow

import (
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// advance is a holder's await of ps (all, or the first with first): it
// classifies the steps opened since the last await (see Pending), begins
// them — publishes the branches' tasks, begins the waits and children,
// runs the sequential step inline — and returns the await's answer, or the
// settlement to park on when what it waits for is not committed.
//
// An await the run was parked at before, or passed (its number up to the
// lease's epoch), was begun by an earlier holder: a holder that took the
// run over cleanly begins nothing there again, but the wait or child whose
// timer woke it. Any other holder (one that found the run in the middle of
// something) begins it again, which every beginning tolerates: a branch
// task already pending absorbs its repeat, a wait keeps the timer stored
// first, a child's admission finds its run.
func (h *holder) advance(c *Context, ps []*Pending, first bool) (int, *settlement) {
	opened := c.open
	c.open = nil
	classify(opened, ps)
	if d := c.divergent(opened, true); d != nil {
		return -1, c.blocked(d)
	}
	if s := h.unblock(c); s != nil {
		return -1, s
	}
	begin := !h.clean || h.rebegin || c.epoch > h.lease.found.Epoch
	if begin {
		if s := h.dispatch(c, opened); s != nil {
			return -1, s
		}
	}
	for _, p := range opened {
		if p.rec != nil && begin && p.class == classWait && p.rec.EventID != "" && p.rec.Seq != p.seq {
			// An event its sender committed before the body came here
			// (it carries no place): the wait's record gives it one, and
			// says when the body reached the wait.
			if _, err := h.markWait(p, state.Wait{Kind: p.call.wait.Kind, Event: p.call.wait.Event,
				Token: p.call.wait.Token, Since: h.e.cfg.TimerNow()}); err != nil {
				return -1, &settlement{kind: settleRelease, err: err}
			}
		}
		if p.rec != nil || !(begin || h.timerOf(p)) {
			continue
		}
		var s *settlement
		switch p.class {
		case classWait:
			s = h.beginWait(c, p)
		case classChild:
			s = h.beginChild(c, p)
		}
		if s != nil {
			return -1, s
		}
	}
	for _, p := range opened {
		if p.class == classInline && p.rec == nil {
			if s := h.runInline(c, p); s != nil {
				return -1, s
			}
		}
	}
	if first && len(ps) > 1 {
		// The first of several to commit is told by revisions: decide on
		// one snapshot of the run, in which any commit not seen is later
		// than every one seen.
		if s := h.refresh(c, ps); s != nil {
			return -1, s
		}
	}
	if won, ok := decide(ps, first); ok {
		h.passed(c, ps, first, won)
		return won, nil
	}
	waits := unresolved(ps)
	return -1, &settlement{kind: settlePark, epoch: c.epoch, waits: waits, begun: c.begunBesides(waits), first: first, began: true}
}

// classify decides what each step opened since the last await is: the one
// step function opened, when this await waits for it, runs inline; every
// other step function is a branch; waits and children are what they are,
// begun by the holder beside an inline step (see Pending).
func classify(opened, ps []*Pending) {
	fns := 0
	for _, p := range opened {
		if p.call.wait == nil && p.call.child == nil {
			fns++
		}
	}
	for _, p := range opened {
		switch {
		case p.call.wait != nil:
			p.class = classWait
		case p.call.child != nil:
			p.class = classChild
		case fns == 1 && slices.Contains(ps, p):
			p.class = classInline
		default:
			p.class = classBranch
		}
	}
}

// begunBesides are the steps the body began as branches, waits or
// children (classified by an await), not known to be committed, other than
// waits: what a park records beside what it waits for (state.Lease.Begun).
func (c *Context) begunBesides(waits []*Pending) []*Pending {
	var out []*Pending
	for _, p := range c.started {
		if p.rec == nil && (p.class == classBranch || p.class == classWait || p.class == classChild) && !slices.Contains(waits, p) {
			out = append(out, p)
		}
	}
	return out
}

// unresolved are the steps of ps not known to be committed.
func unresolved(ps []*Pending) []*Pending {
	var out []*Pending
	for _, p := range ps {
		if p.rec == nil {
			out = append(out, p)
		}
	}
	return out
}

// refresh reads the run's history again and gives ps the records it holds.
func (h *holder) refresh(c *Context, ps []*Pending) *settlement {
	if len(unresolved(ps)) == 0 {
		return nil
	}
	hist, err := h.e.readHistory(h.d.nctx, h.d.identity(), 0)
	if err != nil {
		return &settlement{kind: settleRelease, err: fmt.Errorf("cannot read the run's history: %w", err)}
	}
	hist.waive(h.d.run.Waived, h.d.run.WaivedRev)
	for _, p := range ps {
		if rec := hist.get(p.id); rec != nil {
			p.rec = rec
		}
	}
	for _, rec := range hist.steps {
		c.hist.put(rec)
	}
	return nil
}

// dispatch publishes the task of every branch opened, uncommitted, in the
// order the body started them, each under its step ID as message ID: a
// task already pending for the branch, or one within the broker's
// duplicate window, absorbs it. A holder that found the run cleanly
// publishes them as the first to reach them; any other marks them
// redispatched (the branch then checks that no retry of it waits).
func (h *holder) dispatch(c *Context, opened []*Pending) *settlement {
	width := 0
	for _, p := range opened {
		if p.class == classBranch && p.rec == nil {
			width++
		}
	}
	for _, p := range opened {
		if p.class != classBranch || p.rec != nil {
			continue
		}
		t := state.StepTask(c.run, c.rev, p.id)
		t.Redispatched, t.Upto, t.Width = !h.clean || h.rebegin, c.hist.upto, width
		if c.def.Pinned {
			t.Build = h.e.cfg.Build // a branch of a pinned run runs on its holder's build
		}
		b, err := state.Encode(t)
		if err == nil {
			_, err = jetstream.PublishTask(h.d.nctx, h.e.cfg.Assets.JS, jetstream.BranchSubject(c.run.Workflow, p.id), state.TaskMsgID(c.run, p.id), b)
		}
		if err != nil {
			return &settlement{kind: settleRelease, err: fmt.Errorf("publish the task of branch %s: %w", p.id, err)}
		}
	}
	return nil
}
