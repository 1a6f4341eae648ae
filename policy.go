package jetflow

import (
	"fmt"
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
	// Supersede lets a newer start replace the running run: a start whose
	// input differs from the running generation's cancels that generation
	// (its steps stop and its children are cancelled, as CancelRun does;
	// its record shows it cancelled with code "superseded") and starts a
	// new generation under the same run ID with its own input
	// (OutcomeSuperseded; the new generation's step IDs are
	// <run-id>/<n>.<step>.<occurrence>, so external APIs see new
	// idempotency keys). A start with the running generation's own input
	// is a retry of the start that created it and attaches
	// (OutcomeExisting), so a retried request never cancels its own run.
	// However many superseding starts race, one generation is running when
	// they have returned, each superseded one is cancelled, and each start
	// learns the generation it started or got (Handle.Generation). It
	// acts on another input under either fingerprint mode, overriding
	// FingerprintStrict. It acts on running runs only: a start with another
	// input once the run has ended gets AfterCompleted's or AfterFailed's
	// answer (a conflict under FingerprintStrict, unless StartNew). A late
	// retry of an older generation's start carries another input than the
	// running generation's, and supersedes it too.
	Supersede
)

// CodeSuperseded is the RunError.Code of a generation that a superseding
// start cancelled (Supersede).
const CodeSuperseded = dedupe.CodeSuperseded

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

// toInternal is the admitter's form of p, or ErrInvalidConflictPolicy
// for a field outside its constants.
func (p ConflictPolicy) toInternal() (dedupe.Policy, error) {
	running, err := p.WhileRunning.toInternal()
	if err != nil {
		return dedupe.Policy{}, err
	}
	completed, err := p.AfterCompleted.toInternal()
	if err != nil {
		return dedupe.Policy{}, fmt.Errorf("AfterCompleted: %w", err)
	}
	failed, err := p.AfterFailed.toInternal()
	if err != nil {
		return dedupe.Policy{}, fmt.Errorf("AfterFailed: %w", err)
	}
	return dedupe.Policy{Running: running, Completed: completed, Failed: failed}, nil
}

// conflictPolicyFrom is the public form of an admitter's policy.
func conflictPolicyFrom(p dedupe.Policy) (ConflictPolicy, error) {
	running, err := whileRunningFrom(p.Running)
	if err != nil {
		return ConflictPolicy{}, err
	}
	completed, err := afterEndedFrom(p.Completed)
	if err != nil {
		return ConflictPolicy{}, err
	}
	failed, err := afterEndedFrom(p.Failed)
	if err != nil {
		return ConflictPolicy{}, err
	}
	return ConflictPolicy{WhileRunning: running, AfterCompleted: completed, AfterFailed: failed}, nil
}

func (p ConflictPolicy) envelope() (dedupe.EnvelopePolicy, error) {
	ip, err := p.toInternal()
	if err != nil {
		return dedupe.EnvelopePolicy{}, err
	}
	return dedupe.EnvelopeFromPolicy(ip), nil
}

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
	events       map[string]eventType
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
// workflow that does not override it (WithConflictPolicy). A registry
// refuses a workflow whose policy has a value outside its constants
// (ErrInvalidConflictPolicy), and so does Start.
func WithDefaultConflictPolicy(p ConflictPolicy) WorkflowOption {
	return func(o *workflowOptions) { o.policy = p }
}

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

// rejectedErrorFrom is the public form of the admitter's refusal.
func rejectedErrorFrom(e *dedupe.RejectedError) *RejectedError {
	return &RejectedError{RunID: e.RunID, Status: RunStatus(e.Status)}
}

// FingerprintMode decides what a duplicate start with another input gets.
type FingerprintMode int

const (
	// FingerprintStrict (the default): a start whose run ID exists with
	// another input is ErrIdempotencyConflict, as an Idempotency-Key reused
	// with another payload is.
	FingerprintStrict FingerprintMode = iota
	// FingerprintIgnore: it is an ordinary duplicate; the stored input is
	// kept. A start of another workflow is a conflict in both modes.
	FingerprintIgnore
)

// WithFingerprintMode sets how this start treats an existing run with
// another input. Inputs are compared as JSON values: key order and white
// space do not matter, numbers are compared as written. A value outside
// the constants makes the start fail with ErrInvalidConflictPolicy.
func WithFingerprintMode(m FingerprintMode) StartOption {
	return func(o *startOptions) {
		ignore, err := m.toInternal()
		if err != nil && o.err == nil {
			o.err = err
		}
		o.ignoreInput = ignore
	}
}
