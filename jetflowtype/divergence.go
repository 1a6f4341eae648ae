package jetflowtype

import (
	"fmt"
	"time"
)

// DivergenceKind says how workflow code departs from a run's history: the
// steps a run committed under the code that ran it, which a later replay
// (after a deploy, or by the test kit's replay check) must start again in
// the same places.
type DivergenceKind string

// The kinds of divergence.
const (
	// DivergenceRenamed: at a place of the history the code starts a step
	// that the history does not hold, and never starts the history's step:
	// a new step ID, so the step would run again (its side effects repeat).
	DivergenceRenamed DivergenceKind = "renamed"
	// DivergenceRemoved: the code never starts a step the history holds;
	// what came after it in the history comes earlier now.
	DivergenceRemoved DivergenceKind = "removed"
	// DivergenceReordered: the code starts, in another order, steps that
	// the history holds, across an await (steps in flight together,
	// between the same two awaits, may be started in any order).
	DivergenceReordered DivergenceKind = "reordered"
	// DivergenceInserted: the code starts a new step before steps the
	// history holds (a step added after the end of what the history
	// reached is not a divergence).
	DivergenceInserted DivergenceKind = "inserted"
	// DivergenceKindChanged: the same step ID is another kind of step now
	// (a sleep became a step, a step a child run, an event wait a hook),
	// or a step the run waits for as a branch is run in place now.
	DivergenceKindChanged DivergenceKind = "kind-changed"
	// DivergenceChildChanged: a child step starts a child run of another
	// run ID.
	DivergenceChildChanged DivergenceKind = "child-changed"
	// DivergenceInputChanged: the run's input does not decode into the
	// code's input type.
	DivergenceInputChanged DivergenceKind = "input-changed"
	// DivergencePanicked: the body panicked during the replay.
	DivergencePanicked DivergenceKind = "panicked"
	// DivergenceTimedOut: the body did not return within the replay
	// check's timeout.
	DivergenceTimedOut DivergenceKind = "timed-out"
	// DivergenceUnbounded: the body started more steps than the check
	// allows without reaching every step of the history: a loop over new
	// steps where the history has another step.
	DivergenceUnbounded DivergenceKind = "unbounded"
)

// DivergedStep is a step as a divergence report names it.
type DivergedStep struct {
	StepID string `json:"step_id"`
	Name   string `json:"name"`
	// Kind is "step", "child", "sleep", "event" or "hook".
	Kind string `json:"kind"`
}

func (s *DivergedStep) String() string {
	if s == nil {
		return "no step"
	}
	return fmt.Sprintf("%s %s (%s)", s.Kind, s.Name, s.StepID)
}

// Divergence reports where code departs from a run's history: Position is
// the step's place in the history, counted from 0 in the order the body
// starts steps; History the step the history has there (nil: none, or the
// divergence is the body's own failure); Code the step the code starts
// there (nil: none).
type Divergence struct {
	Kind     DivergenceKind `json:"kind"`
	Position int            `json:"position"`
	History  *DivergedStep  `json:"history,omitempty"`
	Code     *DivergedStep  `json:"code,omitempty"`
	// Detail says more, in words.
	Detail string `json:"detail"`
}

func (d *Divergence) String() string {
	return fmt.Sprintf("diverges at step %d (%s): history has %s, the code starts %s: %s",
		d.Position, d.Kind, d.History, d.Code, d.Detail)
}

// BlockDivergence is RunBlock.Reason of a run whose body diverged from its
// history.
const BlockDivergence = "divergence"

// RunBlock says why a run is blocked (StatusBlocked), where, and since when.
type RunBlock struct {
	// Reason is BlockDivergence.
	Reason string `json:"reason"`
	// Divergence is the report of the replay that blocked the run.
	Divergence *Divergence `json:"divergence,omitempty"`
	// Build and Worker name the code that diverged: the build identity of
	// the worker that replayed it, and the worker.
	Build  string `json:"build,omitempty"`
	Worker string `json:"worker,omitempty"`
	// Since is when the run was first blocked at this place.
	Since time.Time `json:"since"`
}
