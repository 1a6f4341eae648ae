package jetflowtest

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// DivergenceKind says how changed workflow code departs from a run's
// history.
type DivergenceKind string

// The kinds of divergence Replay reports.
const (
	// Renamed: at a place of the history the code starts a step that the
	// history does not hold, and never starts the history's step: a new
	// step ID, so the step would run again (its side effects repeat).
	Renamed DivergenceKind = "renamed"
	// Removed: the code never starts a step the history holds; what came
	// after it in the history comes earlier now.
	Removed DivergenceKind = "removed"
	// Reordered: the code starts, in another order, steps that the history
	// holds, across an await (steps in flight together, between the same
	// two awaits, may be started in any order).
	Reordered DivergenceKind = "reordered"
	// Inserted: the code starts a new step before steps the history holds
	// (a step added at the end of what the history reached is not a
	// divergence).
	Inserted DivergenceKind = "inserted"
	// KindChanged: the same step ID is another kind of step now (a sleep
	// became a step, a step a child run, an event wait a hook).
	KindChanged DivergenceKind = "kind-changed"
	// ChildChanged: a child step starts a child run of another run ID.
	ChildChanged DivergenceKind = "child-changed"
	// InputChanged: the run's input does not decode into the code's input
	// type.
	InputChanged DivergenceKind = "input-changed"
	// Panicked: the body panicked during the replay.
	Panicked DivergenceKind = "panicked"
	// TimedOut: the body did not return within the replay's timeout.
	TimedOut DivergenceKind = "timed-out"
	// Unbounded: the body started more steps than the check allows
	// without reaching every step of the history: a loop over new steps
	// (whose results are zero values in the check) where the history has
	// another step.
	Unbounded DivergenceKind = "unbounded"
)

// ReplayStep is a step as the replay check compares it.
type ReplayStep struct {
	StepID string
	Name   string
	// Kind is "step", "child", "sleep", "event" or "hook".
	Kind string
}

func (s *ReplayStep) String() string {
	if s == nil {
		return "no step"
	}
	return fmt.Sprintf("%s %s (%s)", s.Kind, s.Name, s.StepID)
}

// DivergenceError is Replay's report of changed code that would not
// replay a run's history: where (Position, the step's place in the
// history, counted from 0 in the order the body starts steps; for a
// Ranked history, not counting the waits an event ended), what the
// history has there and what the changed code does.
type DivergenceError struct {
	Workflow string
	RunID    string
	Kind     DivergenceKind
	Position int
	// History is the history's step at Position (nil: none, or the
	// divergence is the body's own failure); Code is the step the changed
	// code starts there (nil: it starts none).
	History *ReplayStep
	Code    *ReplayStep
	// Detail says more, in words.
	Detail string
}

func (e *DivergenceError) Error() string {
	return fmt.Sprintf("jetflowtest: run %s of %s diverges at step %d (%s): history has %s, the code starts %s: %s",
		e.RunID, e.Workflow, e.Position, e.Kind, e.History, e.Code, e.Detail)
}

// ReplayOption configures Replay.
type ReplayOption func(*replayOptions)

type replayOptions struct {
	timeout time.Duration
}

// WithReplayTimeout bounds how long Replay waits for the body (default
// 10s; d <= 0 keeps it). A body still running then is reported as
// TimedOut, its context cancelled.
func WithReplayTimeout(d time.Duration) ReplayOption {
	return func(o *replayOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// Replay checks that wf's code, as it is now, replays h: that a run
// whose history is h, taken over by a worker running this code, goes on
// without running a committed step again or skipping, reordering or
// retyping one. It runs the body in this process against h without NATS,
// calling no step function, and compares the steps it starts with h's in
// order, by step ID (name and occurrence) and kind. Steps the code starts
// after the end of h are new work and allowed. A sleep's duration, a
// step's options and its function are not compared: a committed step is
// never run again, whatever its function now does.
//
// It returns nil when the code replays h, a *DivergenceError at the first
// place where it does not (see DivergenceKind), or ErrInvalidHistory when h
// is not wf's or cannot be replayed.
func Replay(wf jetflow.Registrable, h History, opts ...ReplayOption) error {
	o := replayOptions{timeout: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if err := h.validate(); err != nil {
		return err
	}
	if wf.Name() != h.Workflow {
		return fmt.Errorf("%w: a run of %s checked against workflow %s", ErrInvalidHistory, h.Workflow, wf.Name())
	}
	run := workflow.CheckRun{Workflow: h.Workflow, RunID: h.RunID, Generation: h.Generation, Input: h.Input}
	maxSeq := -1
	for _, s := range h.commitOrder() {
		run.Steps = append(run.Steps, s.record(h.RunID))
		maxSeq = max(maxSeq, s.Seq)
	}
	// Room for every step of the history after as many inserted ones.
	limit := maxSeq + 1 + 2*len(h.Steps) + 16
	res := workflow.Check(wf.Definition(), run, limit, o.timeout)
	return compare(h, res)
}

// commitOrder is h's steps in the order they were committed.
func (h History) commitOrder() []HistoryStep {
	steps := append([]HistoryStep(nil), h.Steps...)
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].CommittedAt.Before(steps[j].CommittedAt) })
	return steps
}

// record is s as the engine's committed record.
func (s HistoryStep) record(runID string) state.Step {
	rec := state.Step{StepID: s.StepID, RunID: runID, Name: s.Name, Seq: s.Seq, Attempt: 1, Output: s.Output,
		Child: s.Child, Kind: s.Kind, EventID: s.EventID, Committed: s.CommittedAt}
	if s.Error != "" {
		rec.Error = &state.ErrorInfo{Message: s.Error, Fatal: s.Fatal, Code: s.Code, Kind: "step"}
	}
	return rec
}

// kind is s's kind in ReplayStep's terms.
func (s HistoryStep) kind() string {
	return workflow.CheckKind(state.Step{Kind: s.Kind, Child: s.Child})
}

func (s HistoryStep) replayStep() *ReplayStep {
	return &ReplayStep{StepID: s.StepID, Name: s.Name, Kind: s.kind()}
}

func startStep(s workflow.CheckStart) *ReplayStep {
	return &ReplayStep{StepID: s.StepID, Name: s.Name, Kind: s.Kind}
}

// comparison holds the two sequences Replay compares.
type comparison struct {
	h     History
	res   workflow.CheckResult
	byID  map[string]HistoryStep
	bySeq map[int]HistoryStep
	// started maps a step ID to its place in res.Started, which is, for a
	// Ranked history, the code's steps but the waits that the history
	// holds without a place.
	started map[string]int
	// all holds the ID of every step the code started.
	all map[string]bool
}

// compare returns the first divergence of res from h, or nil: a place
// where the code starts another step than the history, a step of the
// history the code never starts, one that is another kind of step now,
// or a body that did not end.
func compare(h History, res workflow.CheckResult) error {
	c := comparison{h: h, res: res, byID: map[string]HistoryStep{}, bySeq: map[int]HistoryStep{}, started: map[string]int{}, all: map[string]bool{}}
	for _, s := range h.Steps {
		c.byID[s.StepID] = s
		if s.ordered() {
			c.bySeq[s.Seq] = s
		}
	}
	all := res.Started
	if h.Ranked {
		c.res.Started = slices.DeleteFunc(slices.Clone(all), func(n workflow.CheckStart) bool {
			r, ok := c.byID[n.StepID]
			return ok && !r.ordered()
		})
	}
	for k, n := range c.res.Started {
		c.started[n.StepID] = k
	}
	for _, n := range all {
		c.all[n.StepID] = true
	}
	if res.Returned && len(all) == 0 && errors.Is(res.Err, jetflow.ErrInvalidInput) {
		return c.diverge(InputChanged, 0, nil, nil, res.Err.Error())
	}
	for k, n := range c.res.Started {
		if err := c.at(k, n); err != nil {
			return err
		}
	}
	for k, n := range all {
		if err := c.sameKind(k, n); err != nil {
			return err
		}
	}
	switch {
	case res.Panicked:
		return c.diverge(Panicked, len(all), nil, nil, res.Err.Error())
	case res.TimedOut:
		return c.diverge(TimedOut, 0, nil, nil, "the body did not return within the replay's timeout")
	}
	for _, s := range h.Steps {
		if !c.all[s.StepID] {
			return c.notStarted(s)
		}
	}
	return nil
}

// notStarted is the divergence of a history's step s that the code never
// starts.
func (c comparison) notStarted(s HistoryStep) error {
	n := len(c.res.Started)
	pos := s.Seq
	if !s.ordered() {
		// Its place is not recorded: the code's first new wait of its
		// kind at a place the history leaves free stands in its stead.
		if k, ok := c.newAtFreePlace(s.kind()); ok {
			return c.diverge(Renamed, k, s.replayStep(), startStep(c.res.Started[k]), "a wait the history does not hold in place of one the code never starts")
		}
		pos = n
	}
	var code *ReplayStep
	if pos < n {
		code = startStep(c.res.Started[pos])
	}
	if c.res.Bounded {
		return c.diverge(Unbounded, pos, s.replayStep(), code, fmt.Sprintf("the body started %d steps without reaching this one", n))
	}
	return c.diverge(Removed, pos, s.replayStep(), code, "the body returned without starting this step")
}

// sameKind checks that n, the k-th step the code started, is the kind of
// step the history holds under its ID, with the same child run.
func (c comparison) sameKind(k int, n workflow.CheckStart) error {
	r, known := c.byID[n.StepID]
	switch {
	case !known:
		return nil
	case r.kind() != n.Kind:
		return c.diverge(KindChanged, k, r.replayStep(), startStep(n), fmt.Sprintf("the history's %s is a %s now", r.kind(), n.Kind))
	case r.Child != "" && r.Child != n.Child:
		return c.diverge(ChildChanged, k, r.replayStep(), startStep(n), fmt.Sprintf("the history's child run is %s, the code's %s", r.Child, n.Child))
	}
	return nil
}

// unplacedNotStarted returns a step of the history without a place that
// the code never starts.
func (c comparison) unplacedNotStarted() (HistoryStep, bool) {
	for _, s := range c.h.Steps {
		if !s.ordered() && !c.all[s.StepID] {
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
func (c comparison) at(k int, n workflow.CheckStart) error {
	if e, ok := c.bySeq[k]; ok && e.StepID != n.StepID && !c.inOneGroup(k, e, n) {
		return c.classify(k, e, n)
	}
	if r, ok := c.byID[n.StepID]; ok && r.ordered() && r.Seq != k && !c.sameGroup(k, r.Seq) {
		if w, ok := c.unplacedNotStarted(); ok && r.Seq > k {
			return c.diverge(Removed, k, w.replayStep(), startStep(n), "the code never starts this wait, which the history holds before "+n.StepID)
		}
		return c.diverge(Reordered, k, nil, startStep(n), fmt.Sprintf("the history has this step at place %d", r.Seq))
	}
	return nil
}

// classify names the divergence of a place k where the history has e and
// the code starts n.
func (c comparison) classify(k int, e HistoryStep, n workflow.CheckStart) error {
	_, nKnown := c.byID[n.StepID]
	_, eStarted := c.started[e.StepID]
	switch {
	case nKnown && eStarted:
		return c.diverge(Reordered, k, e.replayStep(), startStep(n), fmt.Sprintf("the history has %s at place %d, the code at %d", n.StepID, c.byID[n.StepID].Seq, k))
	case nKnown:
		return c.diverge(Removed, k, e.replayStep(), startStep(n), "the code never starts the history's step")
	case eStarted:
		return c.diverge(Inserted, k, e.replayStep(), startStep(n), fmt.Sprintf("a new step before the history's, which the code starts at %d", c.started[e.StepID]))
	}
	if c.res.Bounded {
		return c.diverge(Unbounded, k, e.replayStep(), startStep(n), fmt.Sprintf("the body started %d steps, new ones from here, and never the history's", len(c.res.Started)))
	}
	return c.diverge(Renamed, k, e.replayStep(), startStep(n), "a step the history does not hold in place of one the code never starts: it would run again")
}

// inOneGroup: e and n are both in the group of steps the code started
// with n, in flight together, and the history has n in that group too, or
// not at all (its step was not committed when the history was taken).
func (c comparison) inOneGroup(k int, e HistoryStep, n workflow.CheckStart) bool {
	pe, ok := c.started[e.StepID]
	r, known := c.byID[n.StepID]
	if !ok || !c.sameGroup(k, pe) {
		return false
	}
	// n not in the history: in flight when the history was taken.
	return !known || (r.ordered() && c.sameGroup(k, r.Seq))
}

// sameGroup reports whether places i and j of the code's steps are in one
// epoch: started between the same two awaits.
func (c comparison) sameGroup(i, j int) bool {
	s := c.res.Started
	return i < len(s) && j >= 0 && j < len(s) && s[i].Epoch == s[j].Epoch
}

func (c comparison) diverge(kind DivergenceKind, pos int, hist, code *ReplayStep, detail string) error {
	return &DivergenceError{Workflow: c.h.Workflow, RunID: c.h.RunID, Kind: kind, Position: pos, History: hist, Code: code, Detail: detail}
}
