package jetflow

import (
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/jetflowtype"
)

// ConflictPolicy decides what a start gets when its run ID names a run that
// already exists, by the state of that run: WhileRunning, AfterCompleted
// and AfterFailed (which applies to failed and cancelled runs). The zero
// value is the default of the idempotency-key documents this follows:
// attach to a running run, return an ended one.
type ConflictPolicy = jetflowtype.ConflictPolicy

// WhileRunning is what a duplicate start gets while the run is running.
type WhileRunning = jetflowtype.WhileRunning

const (
	// Attach returns the running run (OutcomeExisting). The default.
	Attach = jetflowtype.Attach
	// RejectWhileRunning returns ErrDuplicateRejected (HTTP 409).
	RejectWhileRunning = jetflowtype.RejectWhileRunning
	// Supersede lets a newer start replace the running run: a start whose
	// input differs from the running generation's cancels that generation
	// and starts a new generation under the same run ID with its own input
	// (OutcomeSuperseded); a start with the running generation's own input
	// attaches (OutcomeExisting). See jetflowtype.Supersede.
	Supersede = jetflowtype.Supersede
)

// CodeSuperseded is the RunError.Code of a generation that a superseding
// start cancelled (Supersede).
const CodeSuperseded = jetflowtype.CodeSuperseded

// AfterEnded is what a duplicate start gets once the run has ended.
type AfterEnded = jetflowtype.AfterEnded

const (
	// ReturnExisting returns the ended run (OutcomeExisting). The default.
	ReturnExisting = jetflowtype.ReturnExisting
	// RejectAfterEnd returns ErrDuplicateRejected.
	RejectAfterEnd = jetflowtype.RejectAfterEnd
	// StartNew starts a new run under the same run ID, with this start's
	// input (OutcomeRestarted). However many starts race, one new run is
	// created: the old record's revision is the fence. The new run's step
	// IDs are <run-id>/<n>.<step>.<occurrence>, so external APIs see new
	// idempotency keys.
	StartNew = jetflowtype.StartNew
)

// WithConflictPolicy overrides the workflow's conflict policy for one
// start. An invalid value makes the start fail with
// ErrInvalidConflictPolicy.
func WithConflictPolicy(p ConflictPolicy) StartOption {
	return func(o *startOptions) { o.policy = &p }
}

// WorkflowOption configures a workflow definition.
type WorkflowOption func(*workflowOptions)

type workflowOptions struct {
	policy       ConflictPolicy
	retention    time.Duration
	requireRunID bool
	strictInput  bool
	events       map[string]eventType
	versioning   Versioning
	patches      []string
}

// WithStrictInput refuses a start whose input JSON has a field the
// workflow's input type does not declare, at any depth of its structs
// (encoding/json's DisallowUnknownFields): the start fails at admission
// with ErrInvalidInput (HTTP 400, NATS code invalid_input, a durable
// envelope terminated) and stores nothing, instead of running with the
// field silently dropped — a misspelt "ammount" that would otherwise
// charge the default. It checks every start that carries JSON:
// StartByName, request-reply, the durable start stream, HTTP and webhook
// starts; Start's typed input encodes only declared fields. Inputs
// decoded into a map or any are not affected. Runs already admitted are
// not checked again when they run, so turning it on never fails a run
// that is under way.
func WithStrictInput() WorkflowOption {
	return func(o *workflowOptions) { o.strictInput = true }
}

// RequireRunID makes the caller's run ID mandatory even where a generated
// one is asked for explicitly: a start with WithGeneratedRunID (over NATS
// "generate_run_id": true, over HTTP ?generate_run_id=true) fails with
// ErrRunIDRequired and stores nothing, because a generated ID is one that
// no retry could ever repeat. Use it for workflows whose duplicates are
// costly (payments, emails). A start that names no run ID and asks for no
// generated one is refused for every workflow.
func RequireRunID() WorkflowOption {
	return func(o *workflowOptions) { o.requireRunID = true }
}

// WithRetention sets how long the workflow's run IDs and results are
// remembered after the run ended (completed, failed or cancelled; default:
// the deployment's Topology.Retention, 30 days; at most that). A running
// run is never forgotten, however long it runs. A start after that creates a
// new run and says so (Handle.AfterExpiry), never a silent re-run that looks
// like a duplicate. Register refuses a retention under a second, and
// NewWorker one longer than the deployment's (both ErrInvalidRetention).
func WithRetention(d time.Duration) WorkflowOption {
	return func(o *workflowOptions) { o.retention = d }
}

// WithDefaultConflictPolicy sets the conflict policy of every start of the
// workflow that does not override it (WithConflictPolicy). A registry
// refuses a workflow whose policy has a value outside its constants
// (ErrInvalidConflictPolicy), and so does Start.
func WithDefaultConflictPolicy(p ConflictPolicy) WorkflowOption {
	return func(o *workflowOptions) { o.policy = p }
}

// RejectedError is a duplicate start that the conflict policy refused: Status
// is the existing run's state, for which the policy rejects duplicates. It
// matches ErrDuplicateRejected.
type RejectedError = jetflowtype.RejectedError

// FingerprintMode decides what a duplicate start with another input gets.
type FingerprintMode = jetflowtype.FingerprintMode

const (
	// FingerprintStrict (the default): a start whose run ID exists with
	// another input is ErrIdempotencyConflict, as an Idempotency-Key reused
	// with another payload is.
	FingerprintStrict = jetflowtype.FingerprintStrict
	// FingerprintIgnore: it is an ordinary duplicate; the stored input is
	// kept. A start of another workflow is a conflict in both modes.
	FingerprintIgnore = jetflowtype.FingerprintIgnore
)

// WithFingerprintMode sets how this start treats an existing run with
// another input. Inputs are compared as JSON values: key order and white
// space do not matter, numbers are compared as written. A value outside
// the constants makes the start fail with ErrInvalidConflictPolicy.
func WithFingerprintMode(m FingerprintMode) StartOption {
	return func(o *startOptions) {
		if err := dedupe.ValidateFingerprintMode(m); err != nil && o.err == nil {
			o.err = err
		}
		o.ignoreInput = m == FingerprintIgnore
	}
}
