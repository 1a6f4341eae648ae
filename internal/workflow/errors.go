package workflow

import (
	"errors"
	"fmt"
	"time"
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
	Fatal   bool
	Message string
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
