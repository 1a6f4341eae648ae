package jetflow

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// Sentinel errors. Match them with errors.Is; the typed errors below carry
// the details.
var (
	// ErrInvalidRunID: a run ID is empty, too long or has a character
	// outside [A-Za-z0-9_=-].
	ErrInvalidRunID = state.ErrInvalidRunID
	// ErrInvalidName: a workflow or step name is empty, too long or has a
	// character outside [A-Za-z0-9_-].
	ErrInvalidName = state.ErrInvalidName
	// ErrInputTooLarge: the encoded input is over the limit.
	ErrInputTooLarge = state.ErrInputTooLarge
	// ErrMalformed: bytes from outside (an envelope, a stored record) do not
	// decode.
	ErrMalformed = state.ErrCorrupt
	// ErrInvalidInput: the input cannot be decoded into the workflow's
	// input type.
	ErrInvalidInput = workflow.ErrInput
	// ErrRunIDRequired: the start named no run ID (WithRunID) and did not
	// ask for a generated one (WithGeneratedRunID), or asked for a
	// generated one from a workflow that requires a caller-chosen run ID
	// (RequireRunID). Nothing was stored.
	ErrRunIDRequired = dedupe.ErrRunIDRequired
	// ErrUnknownWorkflow: no worker serves a workflow of that name.
	ErrUnknownWorkflow = errors.New("jetflow: unknown workflow")
	// ErrDuplicateWorkflow: a registry already has a workflow of that name.
	ErrDuplicateWorkflow = errors.New("jetflow: workflow registered twice")
	// ErrRunNotFound: no run has that ID (or it has expired).
	ErrRunNotFound = errors.New("jetflow: run not found")
	// ErrRunFailed is matched by every *RunError.
	ErrRunFailed = errors.New("jetflow: run did not complete")
	// ErrStepFailed is matched by every *StepError.
	ErrStepFailed = workflow.ErrStepFailed
	// ErrInvalidPolicy: a retry policy has a bad field.
	ErrInvalidPolicy = workflow.ErrInvalidPolicy
	// ErrIdempotencyConflict: the run ID names an existing run that the
	// start does not match (another workflow); see *ConflictError. The
	// existing run is not changed.
	ErrIdempotencyConflict = dedupe.ErrConflict
	// ErrDuplicateRejected: the run ID names an existing run and the
	// conflict policy rejects duplicates in its state; see *RejectedError.
	ErrDuplicateRejected = dedupe.ErrRejected
	// ErrInvalidConflictPolicy: a conflict policy has a value outside its
	// constants.
	ErrInvalidConflictPolicy = dedupe.ErrInvalidPolicy
	// ErrInvalidRetention: a workflow retention under a second or longer
	// than the deployment's.
	ErrInvalidRetention = dedupe.ErrInvalidRetention
	// ErrRetryStart: the run ID's run expired while the start was under way
	// (the start stalled for longer than the run lived and was kept). The
	// start created nothing; starting again now creates a new run after
	// expiry (Handle.AfterExpiry).
	ErrRetryStart = dedupe.ErrRetryStart
	// ErrUnavailable: NATS or JetStream could not serve the call now (down,
	// reconnecting, closed or draining, reconnect buffer full, no answer in
	// time, JetStream without a leader or out of resources). The error also
	// wraps its cause. Retry later; for a start, retry with the same run ID:
	// the first attempt either created the run, and the retry finds it, or
	// it did not, and the retry creates it.
	ErrUnavailable = jetstream.ErrUnavailable
)

// ConflictError says which part of a start differed from the existing run
// with its run ID.
type ConflictError = dedupe.ConflictError

// StepError is a step's final failure as the workflow sees it: it returned a
// fatal error or ran out of attempts. The failure is committed, so every
// replay of the run returns the same StepError; the workflow can handle it or
// return it (which fails the run).
type StepError = workflow.StepError

// RunError is how a run that did not complete is reported to the caller
// waiting for its result. Its JSON encoding (a Run's error) has only kind
// and message.
type RunError struct {
	RunID  string    `json:"-"`
	Status RunStatus `json:"-"`
	// Kind is "workflow" (the workflow returned an error), "step" (a step's
	// final failure was returned by the workflow), "input" (undecodable
	// input), "panic" or "cancelled".
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func (e *RunError) Error() string {
	return fmt.Sprintf("jetflow: run %s %s (%s): %s", e.RunID, e.Status, e.Kind, e.Message)
}

// Is makes errors.Is(err, ErrRunFailed) true.
func (e *RunError) Is(target error) bool { return target == ErrRunFailed }

// Retryable wraps err to be retried with the step's backoff. Plain errors
// are retryable too; use Retryable with RetryAfter to ask for a delay.
func Retryable(err error) error { return &RetryableError{Err: err} }

// RetryAfter wraps err to be retried after d (as an HTTP 429 or 503 with a
// Retry-After header asks), instead of the step's backoff. The attempt still
// counts toward MaxAttempts.
func RetryAfter(err error, d time.Duration) error { return &RetryableError{Err: err, After: d} }

// RetryableError is a step error that is retried.
type RetryableError struct {
	Err   error
	After time.Duration
}

func (e *RetryableError) Error() string { return "retryable: " + errString(e.Err) }
func (e *RetryableError) Unwrap() error { return e.Err }

// RetryAfter is the requested delay, zero for the policy's backoff.
func (e *RetryableError) RetryAfter() time.Duration { return e.After }

// Fatal wraps err so that the step is not retried: its failure is committed
// at once and returned to the workflow as a *StepError with Fatal set. A
// workflow returning a fatal error fails its run the same way as any error.
func Fatal(err error) error { return &FatalError{Err: err} }

// FatalError is a step error that is never retried.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return "fatal: " + errString(e.Err) }
func (e *FatalError) Unwrap() error { return e.Err }

// Fatal reports true.
func (e *FatalError) Fatal() bool { return true }

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
