package dedupe

import (
	"fmt"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// The conflict policy is jetflowtype.ConflictPolicy (the root package's
// ConflictPolicy): WhileRunning, AfterCompleted and AfterFailed, whose zero
// values are the defaults (attach while running, return once ended).

// ValidatePolicy returns jetflowtype.ErrInvalidConflictPolicy, naming the
// field and its value, when a field of p is outside its constants: an
// unknown value is an error, never a default.
func ValidatePolicy(p jetflowtype.ConflictPolicy) error {
	switch p.WhileRunning {
	case jetflowtype.Attach, jetflowtype.RejectWhileRunning, jetflowtype.Supersede:
	default:
		return fmt.Errorf("%w: WhileRunning(%d)", jetflowtype.ErrInvalidConflictPolicy, int(p.WhileRunning))
	}
	if err := validAfterEnded(p.AfterCompleted); err != nil {
		return fmt.Errorf("AfterCompleted: %w", err)
	}
	if err := validAfterEnded(p.AfterFailed); err != nil {
		return fmt.Errorf("AfterFailed: %w", err)
	}
	return nil
}

func validAfterEnded(e jetflowtype.AfterEnded) error {
	switch e {
	case jetflowtype.ReturnExisting, jetflowtype.RejectAfterEnd, jetflowtype.StartNew:
		return nil
	}
	return fmt.Errorf("%w: AfterEnded(%d)", jetflowtype.ErrInvalidConflictPolicy, int(e))
}

// ValidateFingerprintMode returns jetflowtype.ErrInvalidConflictPolicy for
// a fingerprint mode outside its constants.
func ValidateFingerprintMode(m jetflowtype.FingerprintMode) error {
	switch m {
	case jetflowtype.FingerprintStrict, jetflowtype.FingerprintIgnore:
		return nil
	}
	return fmt.Errorf("%w: FingerprintMode(%d)", jetflowtype.ErrInvalidConflictPolicy, int(m))
}

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
func decide(p jetflowtype.ConflictPolicy, run state.Run) action {
	var e jetflowtype.AfterEnded
	switch run.Status {
	case state.StatusRunning, state.StatusBlocked:
		switch p.WhileRunning {
		case jetflowtype.RejectWhileRunning:
			return actReject
		case jetflowtype.Supersede:
			return actSupersede
		}
		return actDuplicate
	case state.StatusCancelled:
		if p.WhileRunning == jetflowtype.Supersede && IsSuperseded(run) {
			return actStartNew
		}
		e = p.AfterFailed
	case state.StatusCompleted:
		e = p.AfterCompleted
	default: // failed
		e = p.AfterFailed
	}
	switch e {
	case jetflowtype.RejectAfterEnd:
		return actReject
	case jetflowtype.StartNew:
		return actStartNew
	default:
		return actDuplicate
	}
}

// RejectedError is a duplicate start that the conflict policy refused
// (jetflowtype's: it matches jetflowtype.ErrDuplicateRejected).
type RejectedError = jetflowtype.RejectedError

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

// EnvelopeFromPolicy spells p for the envelope, or returns
// jetflowtype.ErrInvalidConflictPolicy (ValidatePolicy) when p has a value
// outside its constants.
func EnvelopeFromPolicy(p jetflowtype.ConflictPolicy) (EnvelopePolicy, error) {
	if err := ValidatePolicy(p); err != nil {
		return EnvelopePolicy{}, err
	}
	return EnvelopePolicy{
		WhileRunning:   runningNames[p.WhileRunning],
		AfterCompleted: endedNames[p.AfterCompleted],
		AfterFailed:    endedNames[p.AfterFailed],
	}, nil
}

// Policy parses an envelope's policy; base supplies what it leaves empty.
func (e EnvelopePolicy) Policy(base jetflowtype.ConflictPolicy) (jetflowtype.ConflictPolicy, error) {
	p := base
	if err := parseName(e.WhileRunning, runningNames, (*int)(&p.WhileRunning)); err != nil {
		return p, fmt.Errorf("%w: while_running: %w", jetflowtype.ErrInvalidConflictPolicy, err)
	}
	if err := parseName(e.AfterCompleted, endedNames, (*int)(&p.AfterCompleted)); err != nil {
		return p, fmt.Errorf("%w: after_completed: %w", jetflowtype.ErrInvalidConflictPolicy, err)
	}
	if err := parseName(e.AfterFailed, endedNames, (*int)(&p.AfterFailed)); err != nil {
		return p, fmt.Errorf("%w: after_failed: %w", jetflowtype.ErrInvalidConflictPolicy, err)
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
