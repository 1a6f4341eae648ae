package workflow

import (
	"errors"
	"time"

	"github.com/jetflow/jetflow/jetflowtype"
)

// ErrInput marks a run input that cannot be decoded into the workflow's
// input type. The run fails without retries.
var ErrInput = errors.New("jetflow: undecodable input")

// ErrStepFailed is matched by every *StepError (jetflowtype's).
var ErrStepFailed = jetflowtype.ErrStepFailed

// StepError is a step's final failure as the workflow sees it: the step ran
// out of attempts or returned a fatal error, and the failure is committed, so
// a replay returns the same error. The workflow can handle it (branch,
// compensate) or return it, which fails the run. It is
// jetflowtype.StepError (the root package's StepError), named here for the
// engine.
type StepError = jetflowtype.StepError

// CodedError is an error with a code a workflow or caller branches on
// (jetflowtype's). A step function returns one (or any error with an
// ErrorCode() string method); the code is committed with the step's
// failure and survives replay, which the error value itself does not.
type CodedError = jetflowtype.CodedError

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
