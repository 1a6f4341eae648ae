package workflow

import (
	"errors"
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// HistoryStep is a committed step as a divergence check compares it with
// what a body starts.
type HistoryStep struct {
	// Seq is the step's place in the order the body started steps; -1
	// when it is not known (the wait of an event, which its sender
	// committed without knowing the place: it is matched by step ID only).
	Seq    int
	StepID string
	Name   string
	// Kind is CheckKindStep, CheckKindChild or a wait's kind (CheckKind).
	Kind string
	// Child is a child step's child run ID.
	Child string
}

func (s HistoryStep) placed() bool { return s.Seq >= 0 }

// HistoryStepOf is rec as the check compares it.
func HistoryStepOf(rec *state.Step) HistoryStep {
	s := HistoryStep{Seq: rec.Seq, StepID: rec.StepID, Name: rec.Name, Kind: CheckKind(*rec), Child: rec.Child}
	if !placed(rec) {
		s.Seq = -1
	}
	return s
}

// placed reports whether rec's Seq is its place: every record but an
// event's, whose sender does not know the place of the wait it ends, and a
// patch marker's, which takes no place (so that code with a patch replays
// the histories of code without it).
func placed(rec *state.Step) bool { return rec.EventID == "" && rec.Kind != state.StepPatch }

func (s HistoryStep) diverged() *jetflowtype.DivergedStep {
	return &jetflowtype.DivergedStep{StepID: s.StepID, Name: s.Name, Kind: s.Kind}
}

func startedStep(s CheckStart) *jetflowtype.DivergedStep {
	return &jetflowtype.DivergedStep{StepID: s.StepID, Name: s.Name, Kind: s.Kind}
}

// Compare returns the first place where res, a replay check of a body
// (Check), departs from hist, the run's committed steps, or nil when the
// body starts every step of hist in its place, of its kind, and does
// anything new only after them (steps started between the same two awaits
// may come in any order). ranked: the places of hist count only its
// placed steps (a history read from a listing that does not carry them),
// and the code's steps are compared without the unplaced waits hist
// holds.
//
// It is the one comparison of code with history: the test kit's replay
// check reports it, and a worker that replays a run blocks the run with
// it (see divergence).
func Compare(hist []HistoryStep, ranked bool, res CheckResult) *jetflowtype.Divergence {
	c := comparison{hist: hist, res: res, byID: map[string]HistoryStep{}, bySeq: map[int]HistoryStep{}, started: map[string]int{}, all: map[string]bool{}}
	for _, s := range hist {
		c.byID[s.StepID] = s
		if s.placed() {
			c.bySeq[s.Seq] = s
		}
	}
	all := res.Started
	if ranked {
		c.res.Started = slices.DeleteFunc(slices.Clone(all), func(n CheckStart) bool {
			r, ok := c.byID[n.StepID]
			return ok && !r.placed()
		})
	}
	for k, n := range c.res.Started {
		c.started[n.StepID] = k
	}
	for _, n := range all {
		c.all[n.StepID] = true
	}
	if res.Returned && len(all) == 0 && errors.Is(res.Err, ErrInput) {
		return c.diverge(jetflowtype.DivergenceInputChanged, 0, nil, nil, res.Err.Error())
	}
	for k, n := range c.res.Started {
		if d := c.at(k, n); d != nil {
			return d
		}
	}
	for k, n := range all {
		if d := c.sameKind(k, n); d != nil {
			return d
		}
	}
	switch {
	case res.Panicked:
		return c.diverge(jetflowtype.DivergencePanicked, len(all), nil, nil, res.Err.Error())
	case res.TimedOut:
		return c.diverge(jetflowtype.DivergenceTimedOut, 0, nil, nil, "the body did not return within the replay's timeout")
	}
	for _, s := range hist {
		if !c.all[s.StepID] && s.Kind != state.StepPatch {
			return c.notStarted(s)
		}
	}
	return nil
}

// comparison holds the two sequences Compare compares.
type comparison struct {
	hist  []HistoryStep
	res   CheckResult
	byID  map[string]HistoryStep
	bySeq map[int]HistoryStep
	// started maps a step ID to its place in res.Started, which is, for a
	// ranked history, the code's steps but the unplaced waits the
	// history holds.
	started map[string]int
	// all holds the ID of every step the code started.
	all map[string]bool
}

// notStarted is the divergence of a history's step s that the code never
// starts.
func (c comparison) notStarted(s HistoryStep) *jetflowtype.Divergence {
	n := len(c.res.Started)
	pos := s.Seq
	if !s.placed() {
		// Its place is not recorded: the code's first new wait of its
		// kind at a place the history leaves free stands in its stead.
		if k, ok := c.newAtFreePlace(s.Kind); ok {
			return c.diverge(jetflowtype.DivergenceRenamed, k, s.diverged(), startedStep(c.res.Started[k]), "a wait the history does not hold in place of one the code never starts")
		}
		pos = n
	}
	var code *jetflowtype.DivergedStep
	if pos < n {
		code = startedStep(c.res.Started[pos])
	}
	if c.res.Bounded {
		return c.diverge(jetflowtype.DivergenceUnbounded, pos, s.diverged(), code, fmt.Sprintf("the body started %d steps without reaching this one", n))
	}
	return c.diverge(jetflowtype.DivergenceRemoved, pos, s.diverged(), code, "the body returned without starting this step")
}

// sameKind checks that n, the k-th step the code started, is the kind of
// step the history holds under its ID, with the same child run.
func (c comparison) sameKind(k int, n CheckStart) *jetflowtype.Divergence {
	r, known := c.byID[n.StepID]
	switch {
	case !known:
		return nil
	case r.Kind != n.Kind:
		return c.diverge(jetflowtype.DivergenceKindChanged, k, r.diverged(), startedStep(n), fmt.Sprintf("the history's %s is a %s now", r.Kind, n.Kind))
	case r.Child != "" && r.Child != n.Child:
		return c.diverge(jetflowtype.DivergenceChildChanged, k, r.diverged(), startedStep(n), fmt.Sprintf("the history's child run is %s, the code's %s", r.Child, n.Child))
	}
	return nil
}

// unplacedNotStarted returns a step of the history without a place that
// the code never starts.
func (c comparison) unplacedNotStarted() (HistoryStep, bool) {
	for _, s := range c.hist {
		if !s.placed() && !c.all[s.StepID] {
			return s, true
		}
	}
	return HistoryStep{}, false
}

// newAtFreePlace returns the place of the first step of kind that the
// code started, the history does not hold and has no step at.
func (c comparison) newAtFreePlace(kind string) (int, bool) {
	for k, n := range c.res.Started {
		if _, taken := c.bySeq[k]; !taken && !n.Known && n.Kind == kind {
			return k, true
		}
	}
	return 0, false
}

// at compares the k-th step the code started, n, with the history.
func (c comparison) at(k int, n CheckStart) *jetflowtype.Divergence {
	if e, ok := c.bySeq[k]; ok && e.StepID != n.StepID && !c.inOneGroup(k, e, n) {
		return c.classify(k, e, n)
	}
	if r, ok := c.byID[n.StepID]; ok && r.placed() && r.Seq != k && !c.sameGroup(k, r.Seq) {
		if w, ok := c.unplacedNotStarted(); ok && r.Seq > k {
			return c.diverge(jetflowtype.DivergenceRemoved, k, w.diverged(), startedStep(n), "the code never starts this wait, which the history holds before "+n.StepID)
		}
		return c.diverge(jetflowtype.DivergenceReordered, k, nil, startedStep(n), fmt.Sprintf("the history has this step at place %d", r.Seq))
	}
	return nil
}

// classify names the divergence of a place k where the history has e and
// the code starts n.
func (c comparison) classify(k int, e HistoryStep, n CheckStart) *jetflowtype.Divergence {
	_, nKnown := c.byID[n.StepID]
	_, eStarted := c.started[e.StepID]
	switch {
	case nKnown && eStarted:
		return c.diverge(jetflowtype.DivergenceReordered, k, e.diverged(), startedStep(n), fmt.Sprintf("the history has %s at place %d, the code at %d", n.StepID, c.byID[n.StepID].Seq, k))
	case nKnown:
		return c.diverge(jetflowtype.DivergenceRemoved, k, e.diverged(), startedStep(n), "the code never starts the history's step")
	case eStarted:
		return c.diverge(jetflowtype.DivergenceInserted, k, e.diverged(), startedStep(n), fmt.Sprintf("a new step before the history's, which the code starts at %d", c.started[e.StepID]))
	}
	if c.res.Bounded {
		return c.diverge(jetflowtype.DivergenceUnbounded, k, e.diverged(), startedStep(n), fmt.Sprintf("the body started %d steps, new ones from here, and never the history's", len(c.res.Started)))
	}
	return c.diverge(jetflowtype.DivergenceRenamed, k, e.diverged(), startedStep(n), "a step the history does not hold in place of one the code never starts: it would run again")
}

// inOneGroup: e and n are both in the group of steps the code started
// with n, in flight together, and the history has n in that group too, or
// not at all (its step was not committed when the history was taken).
func (c comparison) inOneGroup(k int, e HistoryStep, n CheckStart) bool {
	pe, ok := c.started[e.StepID]
	r, known := c.byID[n.StepID]
	if !ok || !c.sameGroup(k, pe) {
		return false
	}
	// n not in the history: in flight when the history was taken.
	return !known || (r.placed() && c.sameGroup(k, r.Seq))
}

// sameGroup reports whether places i and j of the code's steps are in one
// epoch: started between the same two awaits.
func (c comparison) sameGroup(i, j int) bool {
	s := c.res.Started
	return i < len(s) && j >= 0 && j < len(s) && s[i].Epoch == s[j].Epoch
}

func (c comparison) diverge(kind jetflowtype.DivergenceKind, pos int, hist, code *jetflowtype.DivergedStep, detail string) *jetflowtype.Divergence {
	return &jetflowtype.Divergence{Kind: kind, Position: pos, History: hist, Code: code, Detail: detail}
}
