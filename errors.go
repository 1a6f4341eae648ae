package jetflow

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
	"github.com/jetflow/jetflow/jetflowtype"
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
	// ErrInvalidAttributes: a start's attributes (WithAttributes) break a
	// limit: more than 8, a name outside [a-z][a-z0-9_]{0,31}, a value
	// empty, over 64 bytes or not printable UTF-8. The message names the
	// attribute; nothing is stored.
	ErrInvalidAttributes = state.ErrInvalidAttributes
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
	ErrRunIDRequired = startproto.ErrRunIDRequired
	// ErrUnknownWorkflow: no worker of this deployment has ever served a
	// workflow of that name while workers of the deployment are running (a
	// misspelt name, or one whose workers are not deployed). Retrying does
	// not help until a worker serving it starts. While no worker of the
	// deployment runs at all (none has reported yet, or all are down), a
	// name no worker served yet is ErrNoWorker instead: nothing tells it
	// from a workflow whose workers are still starting. Compare
	// ErrNoWorker.
	ErrUnknownWorkflow = errors.New("jetflow: unknown workflow")
	// ErrNoWorker: no worker serves the workflow now, and it may yet: the
	// workflow is known (a worker served it once) and all its workers are
	// down or restarting, or no worker of the deployment runs at all (a
	// fresh deployment whose workers have not reported yet, or all of them
	// down). It is matched by every *NoWorkerError, which also matches
	// ErrUnavailable: retry later, with the same run ID.
	ErrNoWorker = errors.New("jetflow: no worker running")
	// ErrDuplicateWorkflow: a registry already has a workflow of that name.
	ErrDuplicateWorkflow = errors.New("jetflow: workflow registered twice")
	// ErrRunNotFound: no run has that ID (or it has expired).
	ErrRunNotFound = workflow.ErrRunNotFound
	// ErrRunFailed is matched by every *RunError.
	ErrRunFailed = errors.New("jetflow: run did not complete")
	// ErrStepFailed is matched by every *StepError.
	ErrStepFailed = jetflowtype.ErrStepFailed
	// ErrInvalidPolicy: a retry policy has a bad field.
	ErrInvalidPolicy = jetflowtype.ErrInvalidPolicy
	// ErrIdempotencyConflict: the run ID names an existing run that the
	// start does not match: another workflow, or a different input while
	// the fingerprint mode is strict (the default; see FingerprintMode).
	// See *ConflictError for which one. The existing run is not changed.
	ErrIdempotencyConflict = jetflowtype.ErrIdempotencyConflict
	// ErrDuplicateRejected: the run ID names an existing run and the
	// conflict policy rejects duplicates in its state; see *RejectedError.
	ErrDuplicateRejected = jetflowtype.ErrDuplicateRejected
	// ErrInvalidConflictPolicy: a conflict policy has a value outside its
	// constants.
	ErrInvalidConflictPolicy = jetflowtype.ErrInvalidConflictPolicy
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
	// ErrPermissionDenied: the NATS server refused a write the call needs,
	// because the connection's user may not publish to its subject
	// (deploy/nats/accounts.conf: CancelRun needs jetflow_operator). The
	// message names the subject. Retrying with the same user does not
	// help; what the call wrote before the refused write stays, and a
	// repeat by a user with the rights finishes it.
	ErrPermissionDenied = errors.New("jetflow: permission denied")
	// ErrRunEnded: the run has already completed or failed.
	ErrRunEnded = workflow.ErrRunEnded
	// ErrRunNotBlocked: UnblockRun of a run that is not blocked (running,
	// or ended; a repeat of a successful unblock gets it).
	ErrRunNotBlocked = workflow.ErrRunNotBlocked
	// ErrNothingToWaive: UnblockRun accepting a divergence whose report
	// names no step of the history to go on without (the input no longer
	// decodes, the body panics or never returns): deploy code that replays
	// the run, or cancel it.
	ErrNothingToWaive = workflow.ErrNothingToWaive
	// ErrUndeclaredPatch: Patched with a patch ID the workflow does not
	// declare (WithPatch): the run fails with it (a panic of the body).
	ErrUndeclaredPatch = workflow.ErrUndeclaredPatch
	// ErrWrongGoroutine: Step, Go, Child, a wait or an await called from a
	// goroutine the workflow body started: the body's calls are its
	// history, so they must come from the body itself (start steps side
	// by side with Go). The call fails with it.
	ErrWrongGoroutine = workflow.ErrWrongGoroutine
	// ErrUnawaited: the body returned while steps it started (Go) were
	// never awaited; they were not run, and the run fails with it (code
	// "unawaited_steps"). Await them before returning.
	ErrUnawaited = workflow.ErrUnawaited
	// ErrRunReplaced: Handle.Result's generation of the run was replaced
	// by a newer one under the same run ID (a superseding start, or a
	// start again after it ended) before Result read its outcome, which is
	// no longer kept.
	ErrRunReplaced = errors.New("jetflow: the run's generation was replaced by a newer one")
	// ErrRunNotEnded: Rerun of a run that has not ended (cancel it
	// first, or wait for it).
	ErrRunNotEnded = jetflowtype.ErrRunNotEnded
	// ErrStepNotReached: Rerun from a step the run never committed nor
	// began (a name it never called, an occurrence past its last), or
	// with no step named.
	ErrStepNotReached = jetflowtype.ErrStepNotReached
	// ErrRerunSource: a rerun failed because its source's records before
	// the step it reran from were gone (their retention passed) when a
	// worker took it up; nothing ran (the run's error kind is "rerun").
	ErrRerunSource = workflow.ErrRerunSource
	// ErrInvalidListOptions: a ListOptions field is out of range.
	ErrInvalidListOptions = errors.New("jetflow: invalid list options")
	// ErrInvalidKey: a task key option is not acceptable: an empty key, a
	// key longer than MaxTaskKeyLen bytes, a TTL or lease under one second,
	// an unknown scope, key options without WithTaskKey, or (ResetTaskKey)
	// a scope ID that does not fit the scope. Step returns it to the
	// workflow without running anything.
	ErrInvalidKey = state.ErrInvalidTaskKey
	// ErrUnsafeConnection: NewWorker or NewClient was given a connection
	// whose settings break jetflow's guarantees (a reconnect buffer, which
	// sends writes made while disconnected after the reconnect, out of
	// order with the retries that replaced them). The message names the
	// setting; connect with Connect, or add nats.ReconnectBufSize(-1).
	ErrUnsafeConnection = errors.New("jetflow: connection unsafe for jetflow")
	// ErrForeignFuture: a future awaited with the Context of a run (or a
	// replay) other than the one that started it, a nil future, or
	// AwaitFirst of no futures. Nothing is started or stored.
	ErrForeignFuture = workflow.ErrForeignFuture
	// ErrRunCancelled is the cause (context.Cause) of a running step's or
	// workflow body's context when its run is cancelled.
	ErrRunCancelled = workflow.ErrRunCancelled
)

// ConflictError is a start whose run ID names an existing run that it does
// not match; it says which part differed (Field: "workflow" or "input",
// Stored, Requested) and, for two JSON object inputs, which top-level
// fields (Fields: names and how each changed, never values). The existing
// run is not changed. It matches ErrIdempotencyConflict. Start and
// StartByName return it alike (from a worker's reply too).
type ConflictError = jetflowtype.ConflictError

// FieldDiff is a top-level input field that differs between a start and
// the run its run ID names (ConflictError.Fields): its name, and
// FieldAdded, FieldRemoved or FieldChanged.
type FieldDiff = jetflowtype.FieldDiff

// The changes of a FieldDiff, from the run's stored input to the start's.
const (
	FieldAdded   = jetflowtype.FieldAdded
	FieldRemoved = jetflowtype.FieldRemoved
	FieldChanged = jetflowtype.FieldChanged
	// MaxConflictFields bounds ConflictError.Fields; MoreFields counts the
	// rest.
	MaxConflictFields = jetflowtype.MaxConflictFields
)

// NoWorkerError is a start that no worker answered and that may be
// answered later: a worker served the workflow once (FirstWorker, at
// FirstServed) and none serves it now, or no worker of the deployment
// runs at all and none has served the workflow yet (FirstWorker empty,
// FirstServed zero: a fresh deployment whose workers have not reported
// yet, or all of them down). It matches ErrNoWorker and ErrUnavailable:
// retry later, with the same run ID. Nothing was stored.
type NoWorkerError struct {
	Workflow    string
	FirstWorker string
	FirstServed time.Time
}

func (e *NoWorkerError) Error() string {
	if e.FirstWorker == "" && e.FirstServed.IsZero() {
		return fmt.Sprintf("jetflow: no worker is running for workflow %q: no worker of this deployment has reported yet (or all are down): retry later",
			e.Workflow)
	}
	return fmt.Sprintf("jetflow: no worker is running for workflow %q (known since %s, first served by %s): retry later",
		e.Workflow, e.FirstServed.UTC().Format(time.RFC3339), e.FirstWorker)
}

// Unwrap makes errors.Is(err, ErrNoWorker) and errors.Is(err,
// ErrUnavailable) true.
func (e *NoWorkerError) Unwrap() []error { return []error{ErrNoWorker, ErrUnavailable} }

// StepError is a step's final failure as the workflow sees it: it returned a
// fatal error or ran out of attempts. The failure is committed, so every
// replay of the run returns the same StepError, with the same Code; the
// workflow can handle it (branch on Code, compensate) or return it, which
// fails the run with Kind "step" and the step's Code. It matches
// ErrStepFailed (and, for a wait for an event, ErrEventTimeout or
// ErrHookTaken when that is how it ended), and when the step failed with a
// coded error (ErrorWithCode), errors.As reaches a *CodedError with the
// code. See jetflowtype.StepError for its fields.
type StepError = jetflowtype.StepError

// CodedError is an error with a code that a workflow or a caller branches
// on, such as "card_declined". A step fails with one through ErrorWithCode;
// the code is committed with the step's failure and survives replay (which
// the error value itself does not): the workflow reads it as StepError.Code
// and the caller as RunError.Code. Any error with an ErrorCode() string
// method carries a code the same way. Its Err is the error itself; on the
// *CodedError a StepError or RunError unwraps to, it carries only the
// committed message.
type CodedError = jetflowtype.CodedError

// ErrorWithCode returns err with code attached (a *CodedError). It
// combines with Fatal, RetryAfter and Retryable in either order, for
// example Fatal(ErrorWithCode("card_declined", err)).
func ErrorWithCode(code string, err error) error { return &CodedError{Code: code, Err: err} }

// RunError is how a run that did not complete is reported to the caller
// waiting for its result. It matches ErrRunFailed, and when it has a Code,
// errors.As reaches a *CodedError with it.
// Its JSON encoding (a Run's error) has kind, code and message.
type RunError struct {
	RunID  string    `json:"-"`
	Status RunStatus `json:"-"`
	// Kind is "workflow" (the workflow returned an error), "step" (a step's
	// final failure was returned by the workflow), "input" (undecodable
	// input), "panic", "cancelled" or "rerun" (a rerun whose source's
	// records were gone: ErrRerunSource).
	Kind string `json:"kind"`
	// Code is the code of the error the run failed with: that of the
	// failed step (StepError.Code) or of the workflow's own error
	// (ErrorWithCode); empty when it had none.
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

func (e *RunError) Error() string {
	return fmt.Sprintf("jetflow: run %s %s (%s): %s", e.RunID, e.Status, e.Kind, e.Message)
}

// Is makes errors.Is(err, ErrRunFailed) true.
func (e *RunError) Is(target error) bool { return target == ErrRunFailed }

// Unwrap returns the run's failure as a *CodedError when it has a code
// (nil otherwise).
func (e *RunError) Unwrap() error {
	if e.Code == "" {
		return nil
	}
	return &CodedError{Code: e.Code, Err: errors.New(e.Message)}
}

// runErrorFrom is the public form of a run's stored error.
func runErrorFrom(runID string, status RunStatus, e *state.ErrorInfo) *RunError {
	return &RunError{RunID: runID, Status: status, Kind: e.Kind, Code: e.Code, Message: e.Message}
}

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
