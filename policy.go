package jetflow

import (
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
)

// ConflictPolicy decides what a start gets when its run ID names a run that
// already exists, by the state of that run. The zero value is the default
// of the idempotency-key documents this follows: attach to a running run,
// return an ended one.
type ConflictPolicy struct {
	WhileRunning   WhileRunning
	AfterCompleted AfterEnded
	// AfterFailed applies to failed and cancelled runs.
	AfterFailed AfterEnded
}

// WhileRunning is what a duplicate start gets while the run is running.
type WhileRunning int

const (
	// Attach returns the running run (OutcomeExisting). The default.
	Attach WhileRunning = iota
	// RejectWhileRunning returns ErrDuplicateRejected (HTTP 409).
	RejectWhileRunning
)

// AfterEnded is what a duplicate start gets once the run has ended.
type AfterEnded int

const (
	// ReturnExisting returns the ended run (OutcomeExisting). The default.
	ReturnExisting AfterEnded = iota
	// RejectAfterEnd returns ErrDuplicateRejected.
	RejectAfterEnd
	// StartNew starts a new run under the same run ID, with this start's
	// input (OutcomeRestarted). However many starts race, one new run is
	// created: the old record's revision is the fence. The new run's step
	// IDs are <run-id>/<n>.<step>.<occurrence>, so external APIs see new
	// idempotency keys.
	StartNew
)

func (p ConflictPolicy) internal() dedupe.Policy {
	return dedupe.Policy{
		Running:   dedupe.OnRunning(p.WhileRunning),
		Completed: dedupe.OnEnded(p.AfterCompleted),
		Failed:    dedupe.OnEnded(p.AfterFailed),
	}
}

func (p ConflictPolicy) envelope() dedupe.EnvelopePolicy {
	return dedupe.EnvelopeFromPolicy(p.internal())
}

// WithConflictPolicy overrides the workflow's conflict policy for one
// start. An invalid value makes the start fail with ErrInvalidPolicy.
func WithConflictPolicy(p ConflictPolicy) StartOption {
	return func(o *startOptions) { o.policy = &p }
}

// WorkflowOption configures a workflow definition.
type WorkflowOption func(*workflowOptions)

type workflowOptions struct {
	policy       ConflictPolicy
	retention    time.Duration
	requireRunID bool
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
// like a duplicate.
func WithRetention(d time.Duration) WorkflowOption {
	return func(o *workflowOptions) { o.retention = d }
}

// WithDefaultConflictPolicy sets the conflict policy of every start of the
// workflow that does not override it (WithConflictPolicy).
func WithDefaultConflictPolicy(p ConflictPolicy) WorkflowOption {
	return func(o *workflowOptions) { o.policy = p }
}

// RejectedError is a duplicate start that the conflict policy refused.
type RejectedError = dedupe.RejectedError
