package workflow

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/state"
)

// ErrInput marks a run input that cannot be decoded into the workflow's
// input type. The run fails without retries.
var ErrInput = errors.New("jetflow: undecodable input")

// ErrStepFailed is matched by every *StepError.
var ErrStepFailed = errors.New("jetflow: step failed")

// StepError is a step's final failure as the workflow sees it: the step ran
// out of attempts or returned a fatal error, and the failure is committed, so
// a replay returns the same error. The workflow can handle it (branch,
// compensate) or return it, which fails the run.
type StepError struct {
	RunID    string
	StepID   string
	StepName string
	// Attempts is the attempt on which the failure was committed.
	Attempts int
	// Fatal is true when the step returned a fatal error (no retries).
	Fatal bool
	// Code is the code of the error the step failed with, when it carried
	// one (see errorCode); empty otherwise.
	Code    string
	Message string
	// ChildRunID is the child run a child step stands for; empty for a
	// step.
	ChildRunID string
	// ChildStatus is how that child ended, "failed" or "cancelled"; empty
	// when it could not be started.
	ChildStatus state.Status
}

func (e *StepError) Error() string {
	kind := "failed"
	if e.Fatal {
		kind = "failed fatally"
	}
	return fmt.Sprintf("jetflow: step %s (%s) %s after %d attempt(s): %s", e.StepName, e.StepID, kind, e.Attempts, e.Message)
}

// Is makes errors.Is(err, ErrStepFailed) true.
func (e *StepError) Is(target error) bool { return target == ErrStepFailed }

// Unwrap returns the step's committed failure as an error with its code,
// so errors.As and errors.Is reach a coded error the workflow matches on.
func (e *StepError) Unwrap() error {
	if e.Code == "" {
		return nil
	}
	return &CodedError{Code: e.Code, Message: e.Message}
}

// CodedError is an error with a code a workflow or caller branches on. A
// step function returns one (or any error with an ErrorCode() string
// method); the code is committed with the step's failure and survives
// replay, which the error value itself does not.
type CodedError struct {
	Code    string
	Message string
}

func (e *CodedError) Error() string { return e.Code + ": " + e.Message }

// ErrorCode returns e.Code.
func (e *CodedError) ErrorCode() string { return e.Code }

// codedError is implemented by errors that carry a code.
type codedError interface{ ErrorCode() string }

// errorCode returns the code of the first error in err's chain that has
// one, or "".
func errorCode(err error) string {
	var c codedError
	if errors.As(err, &c) {
		return c.ErrorCode()
	}
	return ""
}

// fatalError is implemented by errors that must not be retried.
type fatalError interface{ Fatal() bool }

// retryAfterError is implemented by errors that ask for a given delay.
type retryAfterError interface{ RetryAfter() time.Duration }

func isFatal(err error) bool {
	var f fatalError
	return errors.As(err, &f) && f.Fatal()
}

func retryAfter(err error) (time.Duration, bool) {
	var r retryAfterError
	if errors.As(err, &r) && r.RetryAfter() > 0 {
		return r.RetryAfter(), true
	}
	return 0, false
}
