package jetflowtype

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors the typed errors below match. Match them with errors.Is;
// the typed errors carry the details.
var (
	// ErrIdempotencyConflict: the run ID names an existing run that the
	// start does not match: another workflow, or a different input while
	// the fingerprint mode is strict (the default; see FingerprintMode).
	// See *ConflictError for which one. The existing run is not changed.
	ErrIdempotencyConflict = errors.New("jetflow: idempotency conflict")
	// ErrDuplicateRejected: the run ID names an existing run and the
	// conflict policy rejects duplicates in its state; see *RejectedError.
	ErrDuplicateRejected = errors.New("jetflow: duplicate start rejected by the conflict policy")
	// ErrStepFailed is matched by every *StepError.
	ErrStepFailed = errors.New("jetflow: step failed")
	// ErrEventTimeout is matched by the error of a wait whose timeout
	// passed before an event came (WithTimeout), from Get, AwaitAll and
	// AwaitFirst alike. It is a *StepError with Code "event_timeout".
	ErrEventTimeout = errors.New("jetflow: no event before the wait's timeout")
	// ErrHookTaken is matched by the error of a wait whose hook token
	// another wait had taken (tokens are single-use). It is also a
	// *StepError with Code "hook_taken".
	ErrHookTaken = errors.New("jetflow: hook token taken by another wait")
	// ErrRunNotFound: the run ID holds no run.
	ErrRunNotFound = errors.New("jetflow: run not found")
	// ErrRunNotEnded: a rerun of a run that has not ended.
	ErrRunNotEnded = errors.New("jetflow: the run has not ended")
	// ErrStepNotReached: a rerun from a step the run never committed nor
	// began (a name it never called, an occurrence past its last).
	ErrStepNotReached = errors.New("jetflow: the run never reached that step")
)

// The codes of a wait's failures (StepError.Code).
const (
	// CodeEventTimeout: the wait's timeout passed before an event came.
	CodeEventTimeout = "event_timeout"
	// CodeHookTaken: another wait had taken the wait's hook token.
	CodeHookTaken = "hook_taken"
)

// ConflictError is a start whose run ID names an existing run that it does
// not match; it says which part differed. The existing run is not changed.
// It matches ErrIdempotencyConflict.
type ConflictError struct {
	// RunID is the start's run ID.
	RunID string
	// Field is what differs: "workflow" or "input".
	Field string
	// Stored is the existing run's value of Field (for the input, a short
	// prefix of its fingerprint).
	Stored string
	// Requested is the start's value of Field.
	Requested string
	// Fields are, when the input differs and both inputs are JSON
	// objects, the top-level fields that differ, by name, sorted: at most
	// MaxConflictFields, MoreFields counting the rest. Names only, never
	// values (an input may hold secrets). Empty when the inputs are not
	// both objects: the error then says only that the input differs.
	Fields []FieldDiff
	// MoreFields counts the differing fields left out of Fields.
	MoreFields int
}

// MaxConflictFields bounds ConflictError.Fields.
const MaxConflictFields = 32

// FieldDiff is a top-level field of a start's input that differs from the
// stored run's input.
type FieldDiff struct {
	// Name is the field's name (cut to 64 bytes, ending with "…", when
	// longer).
	Name string `json:"name"`
	// Change is FieldAdded, FieldRemoved or FieldChanged.
	Change string `json:"change"`
}

// The changes of a FieldDiff, from the stored run's input to the start's.
const (
	// FieldAdded: the start's input has the field, the run's has not.
	FieldAdded = "added"
	// FieldRemoved: the run's input has the field, the start's has not.
	FieldRemoved = "removed"
	// FieldChanged: both have it, with other values (compared as the
	// fingerprint compares them: key order and white space aside, numbers
	// as written).
	FieldChanged = "changed"
)

func (e *ConflictError) Error() string {
	s := fmt.Sprintf("jetflow: idempotency conflict: run %s exists with %s %q, the start asked for %q",
		e.RunID, e.Field, e.Stored, e.Requested)
	if e.Field != "input" {
		return s
	}
	if len(e.Fields) == 0 {
		return s + ": input differs"
	}
	var b strings.Builder
	b.WriteString(s)
	b.WriteString(": input fields differ: ")
	for i, f := range e.Fields {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q (%s)", f.Name, f.Change)
	}
	if e.MoreFields > 0 {
		fmt.Fprintf(&b, ", and %d more", e.MoreFields)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrIdempotencyConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrIdempotencyConflict }

// RejectedError is a duplicate start that the conflict policy refused. It
// matches ErrDuplicateRejected.
type RejectedError struct {
	// RunID is the start's run ID.
	RunID string
	// Status is the existing run's state, for which the policy rejects
	// duplicates.
	Status RunStatus
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("jetflow: run %s exists (%s) and the conflict policy rejects a duplicate start", e.RunID, e.Status)
}

// Is makes errors.Is(err, ErrDuplicateRejected) true.
func (e *RejectedError) Is(target error) bool { return target == ErrDuplicateRejected }

// StepError is a step's final failure as the workflow sees it: it returned a
// fatal error or ran out of attempts. The failure is committed, so every
// replay of the run returns the same StepError, with the same Code; the
// workflow can handle it (branch on Code, compensate) or return it, which
// fails the run (with Kind "step" and the step's Code). It matches
// ErrStepFailed, and when the step failed with a coded error
// (ErrorWithCode), errors.As reaches a *CodedError with the code.
type StepError struct {
	// RunID is the run the step belongs to.
	RunID string
	// StepID is the step's deterministic ID (see StepDetails).
	StepID string
	// StepName is the name the workflow called the step with.
	StepName string
	// Attempts is the attempt on which the failure was committed.
	Attempts int
	// Fatal is true when the step returned a fatal error (Fatal): it was
	// not retried.
	Fatal bool
	// Code is the code of the error the step failed with (ErrorWithCode, or
	// any error in its chain with an ErrorCode() string method); empty when
	// it had none.
	Code string
	// Message is the text of the error the step failed with.
	Message string
	// ChildRunID is the child run a child step (Child) stands for; empty
	// for a step.
	ChildRunID string
	// ChildStatus is how that child ended: StatusFailed or StatusCancelled;
	// empty when the child could not be started (its run ID holds another
	// run, or another input).
	ChildStatus RunStatus
}

func (e *StepError) Error() string {
	if e.Code == CodeEventTimeout {
		// A wait's timeout: an outcome the workflow chose, not a fault.
		return fmt.Sprintf("jetflow: step %s (%s) timed out: %s", e.StepName, e.StepID, e.Message)
	}
	kind := "failed"
	if e.Fatal {
		kind = "failed fatally"
	}
	return fmt.Sprintf("jetflow: step %s (%s) %s after %d attempt(s): %s", e.StepName, e.StepID, kind, e.Attempts, e.Message)
}

// Is makes errors.Is(err, ErrStepFailed) true, and, for a wait for an
// event, errors.Is(err, ErrEventTimeout) or errors.Is(err, ErrHookTaken)
// when that is how it ended.
func (e *StepError) Is(target error) bool {
	switch target {
	case ErrStepFailed:
		return true
	case ErrEventTimeout:
		return e.Code == CodeEventTimeout && isWaitStep(e.StepName)
	case ErrHookTaken:
		return e.Code == CodeHookTaken && isWaitStep(e.StepName)
	}
	return false
}

// Unwrap returns the committed failure as a *CodedError when it has a
// code (nil otherwise), so that errors.As finds the code after a replay,
// where the step's original error value no longer exists.
func (e *StepError) Unwrap() error {
	if e.Code == "" {
		return nil
	}
	return &CodedError{Code: e.Code, Err: errors.New(e.Message)}
}

// isWaitStep reports whether name is the step name of a wait for an
// event (a name the body gives a step never holds '=').
func isWaitStep(name string) bool { return strings.Contains(name, "=") }

// CodedError is an error with a code that a workflow or a caller branches
// on, such as "card_declined". A step fails with one through ErrorWithCode;
// the code is committed with the step's failure and survives replay (which
// the error value itself does not): the workflow reads it as StepError.Code
// and the caller as RunError.Code. Any error with an ErrorCode() string
// method carries a code the same way.
type CodedError struct {
	// Code is the error's code. Keep it stable: workflows branch on it
	// across deploys.
	Code string
	// Err is the error itself. On the *CodedError a StepError or RunError
	// unwraps to, it carries only the committed message.
	Err error
}

func (e *CodedError) Error() string {
	if e.Err == nil {
		return e.Code + ": <nil>"
	}
	return e.Code + ": " + e.Err.Error()
}

// Unwrap returns e.Err.
func (e *CodedError) Unwrap() error { return e.Err }

// ErrorCode returns e.Code.
func (e *CodedError) ErrorCode() string { return e.Code }
