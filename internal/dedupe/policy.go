package dedupe

import (
	"errors"
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/state"
)

// OnRunning is what a duplicate start gets while the run is running.
type OnRunning int

const (
	// Attach (default): the existing run, outcome existing.
	Attach OnRunning = iota
	// RejectRunning: ErrRejected.
	RejectRunning
	// Supersede: a start with another input than the running generation's
	// cancels that generation and starts a new one with its input,
	// outcome superseded; a start with the same input attaches (a retry of
	// the start that created the generation). Concurrent superseding
	// starts leave one generation running.
	Supersede
)

// OnEnded is what a duplicate start gets once the run has ended.
type OnEnded int

const (
	// Return (default): the ended run, outcome existing.
	Return OnEnded = iota
	// RejectEnded: ErrRejected.
	RejectEnded
	// StartNew: a new run under the same run ID (a new generation, with
	// its own step IDs), outcome restarted. Concurrent starts create one.
	StartNew
)

// Policy decides what a duplicate start gets in each state of the run.
// The zero value is the default: attach while running, return once ended.
type Policy struct {
	Running   OnRunning
	Completed OnEnded
	// Failed applies to failed and cancelled runs.
	Failed OnEnded
}

// Validate rejects values outside the enumerations.
func (p Policy) Validate() error {
	if p.Running < Attach || p.Running > Supersede ||
		p.Completed < Return || p.Completed > StartNew || p.Failed < Return || p.Failed > StartNew {
		return fmt.Errorf("%w: conflict policy %+v", ErrInvalidPolicy, p)
	}
	return nil
}

// ErrInvalidPolicy is returned for a conflict policy outside its values.
var ErrInvalidPolicy = errors.New("jetflow: invalid conflict policy")

// action is the decision for one duplicate.
type action int

const (
	actDuplicate action = iota // existing (attach or return)
	actReject
	actStartNew
	actSupersede
)

// decide is the policy's answer for a duplicate of run. A run cancelled by
// a superseding start that did not get to start its new generation (it
// died, or lost the race to write it) is started anew by the next
// superseding start, as the start that cancelled it would have.
func (p Policy) decide(run state.Run) action {
	var e OnEnded
	switch run.Status {
	case state.StatusRunning:
		switch p.Running {
		case RejectRunning:
			return actReject
		case Supersede:
			return actSupersede
		}
		return actDuplicate
	case state.StatusCancelled:
		if p.Running == Supersede && IsSuperseded(run) {
			return actStartNew
		}
		e = p.Failed
	case state.StatusCompleted:
		e = p.Completed
	default: // failed
		e = p.Failed
	}
	switch e {
	case RejectEnded:
		return actReject
	case StartNew:
		return actStartNew
	default:
		return actDuplicate
	}
}

// ErrRejected is matched by every *RejectedError.
var ErrRejected = errors.New("jetflow: duplicate start rejected by the conflict policy")

// RejectedError is a duplicate start that the conflict policy refused.
type RejectedError struct {
	RunID  string
	Status state.Status
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("jetflow: run %s exists (%s) and the conflict policy rejects a duplicate start", e.RunID, e.Status)
}

// Is makes errors.Is(err, ErrRejected) true.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// EnvelopePolicy is a conflict policy as the start envelope spells it:
// while_running "attach" | "reject" | "supersede"; after_completed and after_failed
// "return" | "reject" | "start_new". Empty fields take the defaults.
type EnvelopePolicy struct {
	WhileRunning   string `json:"while_running,omitempty"`
	AfterCompleted string `json:"after_completed,omitempty"`
	AfterFailed    string `json:"after_failed,omitempty"`
}

var (
	runningNames = []string{"attach", "reject", "supersede"}
	endedNames   = []string{"return", "reject", "start_new"}
)

// EnvelopeNames are the values an envelope's policy accepts: for
// while_running, and for after_completed and after_failed, in the order of
// the OnRunning and OnEnded constants. The envelope's JSON Schema lists
// the same.
func EnvelopeNames() (running, ended []string) {
	return slices.Clone(runningNames), slices.Clone(endedNames)
}

// EnvelopeFromPolicy spells p for the envelope.
func EnvelopeFromPolicy(p Policy) EnvelopePolicy {
	return EnvelopePolicy{
		WhileRunning:   runningNames[p.Running],
		AfterCompleted: endedNames[p.Completed],
		AfterFailed:    endedNames[p.Failed],
	}
}

// Policy parses an envelope's policy; base supplies what it leaves empty.
func (e EnvelopePolicy) Policy(base Policy) (Policy, error) {
	p := base
	if err := parseName(e.WhileRunning, runningNames, (*int)(&p.Running)); err != nil {
		return p, fmt.Errorf("%w: while_running: %w", ErrInvalidPolicy, err)
	}
	if err := parseName(e.AfterCompleted, endedNames, (*int)(&p.Completed)); err != nil {
		return p, fmt.Errorf("%w: after_completed: %w", ErrInvalidPolicy, err)
	}
	if err := parseName(e.AfterFailed, endedNames, (*int)(&p.Failed)); err != nil {
		return p, fmt.Errorf("%w: after_failed: %w", ErrInvalidPolicy, err)
	}
	return p, nil
}

func parseName(s string, names []string, dst *int) error {
	if s == "" {
		return nil
	}
	for i, n := range names {
		if s == n {
			*dst = i
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %v", s, names)
}
