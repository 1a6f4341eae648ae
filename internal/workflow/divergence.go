package workflow

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// A body that departs from its run's history must run nothing where it
// departs: a renamed step's new ID has no record, so the step would run
// again and its side effect repeat (a second charge, a second email). So
// before a holder runs, begins or waits on anything, and before a branch
// task runs its step, the calls the body made since its last await are
// compared with the committed records at their places (divergent). Every
// record carries its place (state.Step.Seq, the order the body started
// steps): the steps started between two awaits must be the history's
// steps at those places, as a set (they are in flight together, in no
// order), each of the kind the history committed (a step, a child of the
// same child run, a sleep, an event or hook wait); a step the history
// holds elsewhere is out of place. An event's wait is matched by its step
// ID alone: its sender committed it without knowing its place. Past the
// history's last place there is nothing to compare. A parked run also
// holds what its await waited for (state.Lease.Waits): those steps must be
// started again, and not run in place where the run waits for them as
// branches.
//
// The check costs a map lookup per call and place; a divergence found is
// then reported precisely by a replay check of the body against the same
// history (Check, Compare), which runs no step.

// kind is p's kind in CheckStart.Kind's terms.
func (p *Pending) kind() string {
	switch {
	case p.call.child != nil:
		return CheckKindChild
	case p.call.wait != nil:
		return p.call.wait.Kind
	}
	return CheckKindStep
}

// divergent returns how the steps the body started since its last await,
// group (places group[0].seq to the last's, in order), depart from the
// run's history and from what its parked lease says it waits for, or nil.
// closed: the group is complete (an await or the body's return ends it);
// a branch task checks its group as far as its own step, which may not be
// the group's last. A holder's group is classified (classify) when it is
// checked: a step the lease says the run waits for as a branch, a wait or
// a child must not run in place, nor the other way round.
func (c *Context) divergent(group []*Pending, closed bool) *jetflowtype.Divergence {
	if len(group) == 0 || c.hist == nil {
		return nil
	}
	first, last := group[0].seq, group[len(group)-1].seq
	outside := func(seq int) bool { return seq < first || closed && seq > last }
	for _, p := range group {
		code := &jetflowtype.DivergedStep{StepID: p.id, Name: p.name, Kind: p.kind()}
		if r := c.hist.get(p.id); r != nil {
			hist := HistoryStepOf(r).diverged()
			switch {
			case hist.Kind != code.Kind:
				return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceKindChanged, Position: p.seq, History: hist, Code: code,
					Detail: fmt.Sprintf("the history's %s is a %s now", hist.Kind, code.Kind)}
			case r.Child != "" && p.call.child != nil && r.Child != p.call.child.RunID:
				return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceChildChanged, Position: p.seq, History: hist, Code: code,
					Detail: fmt.Sprintf("the history's child run is %s, the code's %s", r.Child, p.call.child.RunID)}
			case placed(r) && outside(r.Seq):
				return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceReordered, Position: p.seq, Code: code,
					Detail: fmt.Sprintf("the history has this step at place %d", r.Seq)}
			}
			continue
		}
		seq, ok := c.hist.awaitedAt[p.id]
		if !ok {
			continue
		}
		w := c.hist.awaited[seq]
		switch {
		case outside(seq):
			return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceReordered, Position: p.seq, Code: code,
				Detail: fmt.Sprintf("the run waits for this step at place %d", seq)}
		case p.class == classInline && !w.inline:
			return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceKindChanged, Position: p.seq, History: code, Code: code,
				Detail: "the run waits for this step begun as a branch, a wait or a child, which the code runs in place now: it would run twice"}
		case p.class != classOpen && p.class != classInline && w.inline:
			return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceKindChanged, Position: p.seq, History: code, Code: code,
				Detail: "the run waits for the retry of this sequential step, which the code begins as a branch, a wait or a child now"}
		}
	}
	if !closed {
		return nil
	}
	for seq := first; seq <= last; seq++ {
		var hist *jetflowtype.DivergedStep
		if e := c.hist.at(seq); e != nil {
			hist = HistoryStepOf(e).diverged()
		} else if w, ok := c.hist.awaited[seq]; ok {
			hist = &jetflowtype.DivergedStep{StepID: w.id, Name: state.StepName(w.id), Kind: CheckKindStep}
		}
		if hist == nil || slices.ContainsFunc(group, func(p *Pending) bool { return p.id == hist.StepID }) {
			continue
		}
		p := group[seq-first]
		return &jetflowtype.Divergence{Kind: jetflowtype.DivergenceRenamed, Position: seq, History: hist,
			Code:   &jetflowtype.DivergedStep{StepID: p.id, Name: p.name, Kind: p.kind()},
			Detail: "the code does not start the history's step here"}
	}
	return nil
}

// returnDivergent is the divergence of a body that returned: the steps it
// started after its last await, a placed record or an awaited step at a
// place it never reached, or (a branch task) a body that returned without
// starting the task's step; or nil.
func (c *Context) returnDivergent() *jetflowtype.Divergence {
	if c.hist == nil {
		return nil
	}
	if d := c.divergent(c.open, true); d != nil {
		return d
	}
	var missed *jetflowtype.Divergence
	for seq, rec := range c.hist.places {
		if seq >= c.seq && (missed == nil || seq < missed.Position) {
			missed = &jetflowtype.Divergence{Kind: jetflowtype.DivergenceRemoved, Position: seq, History: HistoryStepOf(rec).diverged(),
				Detail: "the body returned without starting this step"}
		}
	}
	for seq, w := range c.hist.awaited {
		if seq >= c.seq && (missed == nil || seq < missed.Position) {
			missed = &jetflowtype.Divergence{Kind: jetflowtype.DivergenceRemoved, Position: seq,
				History: &jetflowtype.DivergedStep{StepID: w.id, Name: state.StepName(w.id), Kind: CheckKindStep},
				Detail:  "the body returned without starting this step, which the run waits for"}
		}
	}
	if missed == nil && c.mode == modeBranch {
		missed = &jetflowtype.Divergence{Kind: jetflowtype.DivergenceRemoved, Position: c.seq,
			History: &jetflowtype.DivergedStep{StepID: c.branch, Name: state.StepName(c.branch), Kind: CheckKindStep},
			Detail:  "the body returned without starting the step this branch task runs"}
	}
	return missed
}

// reportTimeout bounds the replay check that reports a divergence found
// (report).
const reportTimeout = 10 * time.Second

// report is the divergence found, inc, as the replay check reports it
// (Check and Compare over the same history: the kind of divergence and
// the first place of it, which a check of the whole body tells better
// than the group where the replay found it), or inc itself when the check
// finds none.
func (c *Context) report(inc *jetflowtype.Divergence) *jetflowtype.Divergence {
	def, ok := c.exec.cfg.Definitions[c.run.Workflow]
	if !ok {
		return inc
	}
	if d := checkHistory(def, c.hist, c.run); d != nil {
		return d
	}
	return inc
}

// checkHistory replays def's body against hist, the records of run, in a
// replay check (Check: no step runs) and compares what it starts with them
// (Compare).
func checkHistory(def Definition, hist *history, run state.Run) *jetflowtype.Divergence {
	steps := hist.compared()
	limit := len(steps)*3 + 16
	if n := len(steps); n > 0 && steps[n-1].Seq >= 0 {
		limit += steps[n-1].Seq
	}
	return Compare(steps, false, Check(def, hist.checkRun(run), limit, reportTimeout))
}

// CheckStored replays def's code against the committed history of run as
// it is stored now (the steps an operator waived left out), running
// nothing, and returns how the code departs from it: what a worker of this
// code would block the run for. Nil: the code replays the run. What the
// run's parked lease says it waits for is not compared here (a worker's
// replay compares it too).
func CheckStored(ctx context.Context, assets *jetstream.Assets, def Definition, run state.Run) (*jetflowtype.Divergence, error) {
	identity := state.RunIdentity(run.RunID, run.Generation)
	entries, err := assets.Steps.Prefix(ctx, identity, 0)
	hist, err := decodeHistory(identity, entries, err)
	if err != nil {
		return nil, err
	}
	hist.waive(run.Waived, run.WaivedRev)
	return checkHistory(def, hist, run), nil
}
