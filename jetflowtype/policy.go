package jetflowtype

import "errors"

// ErrInvalidConflictPolicy: a conflict policy has a value outside its
// constants.
var ErrInvalidConflictPolicy = errors.New("jetflow: invalid conflict policy")

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
const CodeSuperseded = "superseded"

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
