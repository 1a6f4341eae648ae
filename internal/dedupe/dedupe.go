// Package dedupe decides admission: for one run ID exactly one run record is
// ever created (G1), and every later start gets that run back with its state
// and the number of duplicates it has absorbed (G2).
//
// The authority is the runs bucket: the record is written with
// create-if-absent, and a start learns whether it created the run by
// comparing the writer token in the stored record with its own, which also
// makes a create retried after a lost reply come back as "created". Only
// the start that created the record publishes the run's start task: a
// duplicate publishes nothing, so it can never wake the run (G25).
package dedupe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Outcome says what a start did.
type Outcome int

const (
	// Created: this start created the run.
	Created Outcome = iota + 1
	// Existing: the run already existed; the start was absorbed.
	Existing
	// Restarted: the run had ended and the policy started a new one under
	// the same run ID.
	Restarted
	// Superseded: the run was running, and the policy (Supersede)
	// cancelled its generation and started a new one with this start's
	// input.
	Superseded
)

func (o Outcome) String() string {
	switch o {
	case Created:
		return "created"
	case Existing:
		return "existing"
	case Restarted:
		return "restarted"
	case Superseded:
		return "superseded"
	default:
		return "unknown"
	}
}

// Request is one start.
type Request struct {
	RunID    string
	Workflow string
	Input    json.RawMessage
	// Source names where the start came from (client name), for the audit.
	Source string
	// IgnoreInput makes a duplicate with another input an ordinary
	// duplicate instead of a conflict (the stored input is kept either way).
	IgnoreInput bool
	// Policy decides what a duplicate gets in each state of the run.
	Policy jetflowtype.ConflictPolicy
	// Retention is how long the run's record is kept after the run ended
	// (0: the deployment's; at most the deployment's). A running run's
	// record never expires.
	Retention time.Duration
	// Entry is the interface the start came in through, for the starts
	// metric: "sdk" (default), "nats", "http", "webhook" or "child".
	Entry string
	// Parent links a child run to the run (and step) that starts it.
	Parent *state.ParentLink
	// Attributes are the run's business keys (state.ValidateAttributes),
	// stored on the record the start creates. They are metadata, not part
	// of the fingerprint: a duplicate's attributes are ignored.
	Attributes map[string]string
	// Rerun links a run started by a rerun to its source (state.Run.Rerun).
	Rerun *state.RerunLink
}

// Result is the admission decision.
type Result struct {
	Outcome Outcome
	// Run is the stored run record: the one just created, or the existing
	// one with its current state. When the generation this start made was
	// already replaced by a newer one before the start read it back (see
	// found), Run is that generation as far as the stored record tells:
	// its number and how it ended, with no output or error.
	Run state.Run
	// Revision of Run in the runs bucket. When Stored is false it is the
	// revision of the record stored now, which is not Run (a newer
	// generation replaced the one this start made).
	Revision uint64
	// Stored: Run is the record stored at Revision.
	Stored bool
	// Duplicates is how many duplicate starts the run has absorbed,
	// counting this one if it was a duplicate.
	Duplicates int64
	// AfterExpiry: Created over the marker of a run with the same ID whose
	// retention passed. The old run is forgotten; this is a new run, not a
	// duplicate.
	AfterExpiry bool
}

// Admitter admits starts. It is safe for concurrent use.
type Admitter struct {
	assets  *jetstream.Assets
	runs    *runs.Store
	now     func() time.Time
	metrics *metrics.Metrics
	hooks   Hooks
	tracer  *tracing.Tracer
	log     zerolog.Logger
	// cancelled finishes the cancel of a superseded generation
	// (Config.Cancelled).
	cancelled func(ctx context.Context, run state.Run, first bool) error
}

// Hooks let tests stop an admission at exact points. Nil hooks do nothing.
type Hooks struct {
	// BeforeCreate runs in Admit before the run record is written or read:
	// a start that stalls before it has done anything.
	BeforeCreate func(runID string)
	// BeforeStartPublished runs in Admit once this call created the run
	// record, before it publishes the run's start task: a start that dies
	// or stalls between its two writes.
	BeforeStartPublished func(runID string)
	// AfterRestartPublished runs once a start that replaces an ended
	// generation has published the new generation's start task, before it
	// replaces the record: a start that stalls there while the task's
	// receiver writes the generation for it.
	AfterRestartPublished func(runID string, generation int)
	// AfterSupersede runs once a superseding start has written the
	// running generation cancelled (run, as written), before it tells
	// anyone or starts the new one.
	AfterSupersede func(run state.Run)
}

// SetHooks installs h. Call it before the Admitter is used.
func (a *Admitter) SetHooks(h Hooks) { a.hooks = h }

// ErrStaleStart is Materialize's answer to a start task that must create
// nothing: its run ID's record expired after the task was published (the
// task of a duplicate start left in the stream past the broker's window, or
// a start task consumed after its run's retention). The task is dropped.
var ErrStaleStart = errors.New("jetflow: stale start task")

// ErrRetryStart: the run ID's record expired while the start was under way.
// The start overlapped the whole life of that run (its own start task may
// have created it), so it creates nothing; a new start of the run ID, made
// now, creates a new run after expiry (Result.AfterExpiry). Retrying is
// safe.
var ErrRetryStart = errors.New("jetflow: the run expired while it was being started; start it again")

// Config is what an Admitter works with besides its assets. Every field
// may be left zero.
type Config struct {
	// Now is the clock of audit entries and records (default time.Now).
	Now func() time.Time
	// Metrics counts starts (nil: none).
	Metrics *metrics.Metrics
	// Tracer emits a jetflow.start span per start (nil: none).
	Tracer *tracing.Tracer
	// Cancelled is what a superseding start does once it has cancelled a
	// running generation: tell the run's workers and parent, and cancel
	// its children, as a cancel of the run does (workflow.Canceller.Ended;
	// nil: nothing). It is called again by a start that finds the
	// cancelled generation without its successor, so it must be safe to
	// repeat.
	Cancelled func(ctx context.Context, run state.Run, first bool) error
	// Logger receives what an admission has to tell besides its answer (a
	// start task published again under another message ID, see
	// publishStart). The zero Logger logs nothing.
	Logger zerolog.Logger
}

// New returns an Admitter over provisioned assets.
func New(assets *jetstream.Assets, cfg Config) *Admitter {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Admitter{assets: assets, runs: runs.New(assets), now: cfg.Now, metrics: cfg.Metrics, tracer: cfg.Tracer,
		cancelled: cfg.Cancelled, log: cfg.Logger}
}

// Validate checks a request without touching NATS.
func Validate(req Request) error {
	if err := state.ValidateRunID(req.RunID); err != nil {
		return err
	}
	if err := state.ValidateName(req.Workflow); err != nil {
		return err
	}
	if err := state.ValidateSource(req.Source); err != nil {
		return err
	}
	if err := state.ValidateAttributes(req.Attributes); err != nil {
		return err
	}
	if err := ValidatePolicy(req.Policy); err != nil {
		return err
	}
	if req.Retention != 0 && req.Retention < time.Second {
		return fmt.Errorf("%w: %s is less than a second", ErrInvalidRetention, req.Retention)
	}
	if len(req.Input) > state.MaxInputBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", state.ErrInputTooLarge, len(req.Input), state.MaxInputBytes)
	}
	if !json.Valid(req.Input) {
		return fmt.Errorf("%w: input is not valid JSON", state.ErrCorrupt)
	}
	return nil
}

// Admit starts the run req.RunID or finds it; without a deadline on ctx it
// gives up after DefaultTimeout. A repeat call with the same run
// ID, from this or any other process and at any time within the retention,
// gets Existing and the stored run, however the calls interleave; exactly one
// call ever gets Created (a call retried internally after a lost reply
// recognises its own write).
//
// After the retention, the run ID's record has expired: a call that began
// after that creates a new run and says so (AfterExpiry). A call that began
// before the record expired (it stalled while the run ran and expired) was
// that run's start or duplicate: it creates nothing and gets ErrRetryStart.
// The two are told apart by the expiry marker's time (the server's clock)
// and the time the call began (this process's clock), so clocks skewed by
// less than the retention are enough; a start refused because of skew
// succeeds when retried after it.
//
// The run record is written first (create-if-absent). Only the call that
// created it publishes the run's start task (Nats-Msg-Id = run ID, so that
// the call's own retries of the publish store one task): a duplicate reads
// the record and records itself on the run's audit, and publishes nothing,
// so that no duplicate ever hands the run to a holder (G25). If this
// process dies between the record and the start task, the run is running
// with no task: the sweeper finds it and wakes it (internal/sweep), and a
// start task published late by a stalled call is dropped without a replay
// by the worker that receives it, the run having been held meanwhile
// (internal/workflow, startRole).
//
// The trace context in ctx (a span, or a remote parent extracted from a
// request) is the parent of the start's jetflow.start span, and the run
// carries it (Run.TraceParent).
func (a *Admitter) Admit(ctx context.Context, req Request) (res Result, err error) {
	// invalid: the request itself is refused (Validate), the caller's
	// mistake, counted apart from the engine's failures.
	invalid := false
	ctx, span := a.tracer.StartAdmission(ctx, req.RunID, req.Workflow, req.Entry)
	defer func() {
		outcome := outcomeName(res, err, invalid)
		span.End(outcome, err)
		a.observe(req.Entry, req.Workflow, outcome, res)
	}()
	if err := Validate(req); err != nil {
		invalid = true
		return Result{}, err
	}
	if max := a.assets.Topology.Retention; req.Retention > max {
		return Result{}, fmt.Errorf("%w: retention %s is longer than the deployment's %s", ErrInvalidRetention, req.Retention, max)
	}
	if _, ok := ctx.Deadline(); !ok {
		// Retries after lost answers are bounded as a whole, not per call.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	// Before anything is written: a record that expired after this is
	// one this call may have created or been a duplicate of. The wall
	// clock, whatever a.now is, as the expiry marker is stamped by the
	// server's.
	by := starter{began: time.Now()}
	token := nuid.Next()
	traceParent := tracing.TraceParent(ctx)
	if h := a.hooks.BeforeCreate; h != nil {
		h(req.RunID)
	}
	rec, err := a.newRecord(req, token)
	if err != nil {
		return Result{}, err
	}
	rec.TraceParent = traceParent
	task, err := state.Encode(state.StartTask(rec))
	if err != nil {
		return Result{}, err
	}
	st, err := a.createOrRead(ctx, rec, by)
	if err != nil {
		return Result{}, fmt.Errorf("jetflow: start %s: %w", req.RunID, err)
	}
	res = Result{Run: st.run, Revision: st.rev, Stored: true, AfterExpiry: st.afterExpiry}
	if !st.created {
		return a.duplicate(ctx, req, rec, res)
	}
	// This call made the run: its start task now. (A run made over an
	// expired record's marker has had its own start task published before
	// its record, by readExisting.)
	if !st.afterExpiry {
		if h := a.hooks.BeforeStartPublished; h != nil {
			h(req.RunID)
		}
		if err := a.publishUntilDone(ctx, req.Workflow, req.RunID, task); err != nil {
			return Result{}, fmt.Errorf("jetflow: start %s: its run record is written, its start task is not (a retry of the start, or the sweeper, starts the run): %w", req.RunID, err)
		}
	}
	res.Outcome, res.Run, res.Stored = Created, st.mine, st.mine.Token == st.run.Token && st.mine.Generation == st.run.Generation
	return res, nil
}

// duplicate decides what a start gets for a run that already exists
// (res.Run at res.Revision), by the conflict policy and the fingerprint, and
// records the attempt on the run's audit. rec is the record the start would
// have created: its fingerprint, and its token, which every generation the
// start tries to make carries too, so that whichever of its rounds made
// one is recognised (a start task of an earlier round may be the one a
// worker wrote).
func (a *Admitter) duplicate(ctx context.Context, req Request, rec state.Run, res Result) (Result, error) {
	res.Outcome = Existing
	fp := rec.Fingerprint
	// cancelled: the last round wrote the running generation cancelled;
	// this round restarts it, however many rounds the start has lost.
	cancelled := false
	for round := 0; ; round++ {
		restartOwn := cancelled
		cancelled = false
		run := res.Run
		entry := state.AuditEntry{At: a.now().UTC(), Source: req.Source, Status: run.Status,
			FingerprintMatch: run.Workflow == req.Workflow && (run.Fingerprint == "" || run.Fingerprint == fp)}
		var refusal error
		switch duplicateDecision(req, run, entry.FingerprintMatch, round, restartOwn) {
		case dupOtherWorkflow:
			entry.Outcome = state.AuditConflict
			refusal = &ConflictError{RunID: req.RunID, Field: "workflow", Stored: run.Workflow, Requested: req.Workflow}
		case dupOutraced:
			// Other starts superseded each generation before this one
			// could: it started nothing, cancelled nothing it did not
			// restart, and its input is not running.
			return res, fmt.Errorf("%w: start %s lost to other superseding starts of its run ID %d times in a row; start it again",
				jetstream.ErrUnavailable, req.RunID, round)
		case dupSupersede:
			var err error
			if cancelled, err = a.supersede(ctx, req, run, res.Revision); err != nil {
				return res, fmt.Errorf("jetflow: start %s, superseding generation %d: %w", req.RunID, run.Generation, err)
			}
			// Decide again on what is stored now: the generation this
			// start or another one cancelled, or a newer generation.
			if res.Run, res.Revision, err = a.reread(ctx, req.RunID); err != nil {
				return res, fmt.Errorf("jetflow: start %s: %w", req.RunID, err)
			}
			continue
		case dupRestart:
			if IsSuperseded(run) {
				// Whoever cancelled it may have died before telling its
				// workers, parent and children: repeat it.
				if err := a.finishCancel(ctx, run, false); err != nil {
					return res, fmt.Errorf("jetflow: start %s, superseding generation %d: %w", req.RunID, run.Generation, err)
				}
			}
			st, err := a.restart(ctx, req, rec.Token, run, res.Revision)
			if err != nil {
				return res, fmt.Errorf("jetflow: start %s again: %w", req.RunID, err)
			}
			res.Run, res.Revision = st.run, st.rev
			if !st.created {
				continue // another start replaced it first: decide again on its run
			}
			res.Run, res.Stored = st.mine, st.mine.Token == st.run.Token && st.mine.Generation == st.run.Generation
			res.Outcome, entry.Outcome = Restarted, state.AuditRestarted
			if IsSuperseded(run) {
				res.Outcome, entry.Outcome = Superseded, state.AuditSuperseded
			}
		case dupOtherInput:
			entry.Outcome = state.AuditConflict
			ce := &ConflictError{RunID: req.RunID, Field: "input", Stored: short(run.Fingerprint), Requested: short(fp)}
			ce.Fields, ce.MoreFields, _ = DiffFields(run.Input, req.Input)
			refusal = ce
		case dupReject:
			entry.Outcome = state.AuditRejected
			refusal = &RejectedError{RunID: req.RunID, Status: run.Status}
		default: // dupAttach
			entry.Outcome = state.AuditExisting
		}
		entry.Generation = res.Run.Generation
		// The repair check and the audit side by side: one round trip.
		started := make(chan error, 1)
		go func(res Result) { started <- a.ensureStarted(ctx, res) }(res)
		var err error
		res.Duplicates, err = a.runs.RecordDuplicate(ctx, req.RunID, entry)
		if serr := <-started; serr != nil {
			return res, fmt.Errorf("jetflow: start %s: %w", req.RunID, serr)
		}
		if err != nil {
			return res, fmt.Errorf("jetflow: start %s: audit duplicate: %w", req.RunID, err)
		}
		return res, refusal
	}
}

// dupDecision is what a duplicate start does with the run it found: a row
// of duplicateDecision's table.
type dupDecision int

const (
	// dupAttach: the start gets the run as it is (Existing): the policy
	// attaches or returns it, a superseding start's same input attaches
	// to the generation it started, or a start that wants a new run lost
	// too many rounds to other restarts and gets the newest.
	dupAttach dupDecision = iota
	// dupOtherWorkflow: the run ID names a run of another workflow: a
	// conflict, whatever the policy.
	dupOtherWorkflow
	// dupOutraced: a superseding start lost too many rounds in a row to
	// other superseding starts: a retryable refusal; it started nothing.
	dupOutraced
	// dupSupersede: the policy supersedes a running generation with other
	// input: cancel it, then decide again on what is stored.
	dupSupersede
	// dupRestart: the policy starts a new generation after this one ended
	// (or a superseded one): restart, and decide again if another start
	// replaced it first.
	dupRestart
	// dupOtherInput: the same run ID with other input (and fingerprints
	// checked): a conflict, before the policy's own refusal.
	dupOtherInput
	// dupReject: the policy refuses a repeat of the same request.
	dupReject
)

// duplicateDecision is the duplicate start's decision table, read top to
// bottom; the first row that matches decides. run is the run the start
// found, match whether its workflow and fingerprint are the start's, round
// how many times the start has decided already, restartOwn whether the
// last round cancelled the running generation (which this one restarts,
// however many rounds it lost).
//
//	row | condition                                                             | decision
//	1   | run of another workflow                                               | dupOtherWorkflow
//	2   | superseding, and maxSupersedeRounds rounds lost (not restarting own)   | dupOutraced
//	3   | policy supersedes, other input                                        | dupSupersede
//	4   | policy starts new, and restarting own or rounds left (maxRounds)      | dupRestart
//	5   | policy supersedes, same input                                         | dupAttach
//	6   | other input, fingerprints checked                                     | dupOtherInput
//	7   | policy rejects                                                        | dupReject
//	8   | anything else                                                         | dupAttach
func duplicateDecision(req Request, run state.Run, match bool, round int, restartOwn bool) dupDecision {
	act := decide(req.Policy, run)
	switch {
	case run.Workflow != req.Workflow:
		return dupOtherWorkflow
	case superseding(act, run, match) && round >= maxSupersedeRounds && !(restartOwn && act == actStartNew):
		return dupOutraced
	case act == actSupersede && !match:
		return dupSupersede
	case act == actStartNew && (restartOwn || round < maxRounds(act, run)):
		return dupRestart
	case act == actSupersede:
		return dupAttach
	case !match && !req.IgnoreInput:
		return dupOtherInput
	case act == actReject:
		return dupReject
	}
	return dupAttach
}

// maxRestartRounds bounds how often a start that wants a new run loses the
// race to another one and looks again (each loss means a new run exists).
const maxRestartRounds = 3

// maxSupersedeRounds bounds the same for superseding starts, which each
// start a generation of their own: of n racing, the last to win has lost
// up to 2(n-1) rounds (a cancel and a restart per winner before it). A
// start that loses more gets ErrUnavailable: it started nothing.
const maxSupersedeRounds = 64

// superseding reports whether act on run (match: the start's input is
// the run's) is a superseding start's: cancelling the running generation,
// or starting the next one after a superseded generation.
func superseding(act action, run state.Run, match bool) bool {
	return act == actSupersede && !match || act == actStartNew && IsSuperseded(run)
}

// maxRounds is the bound for act on run.
func maxRounds(act action, run state.Run) int {
	if act == actStartNew && IsSuperseded(run) {
		return maxSupersedeRounds
	}
	return maxRestartRounds
}

// IsSuperseded reports whether run is a generation that a superseding start
// cancelled.
func IsSuperseded(run state.Run) bool {
	return run.Status == state.StatusCancelled && run.Error != nil && run.Error.Code == jetflowtype.CodeSuperseded
}

// supersede cancels the generation run (read at rev, running) for a newer
// start. Of concurrent superseding starts that read the same revision, one
// cancels it (written) and finishes the cancel (finishCancel); the others
// find it changed. Either way the caller reads what is stored and decides
// again.
func (a *Admitter) supersede(ctx context.Context, req Request, run state.Run, rev uint64) (written bool, err error) {
	cancelled, written, err := a.runs.Supersede(ctx, run, rev, &state.ErrorInfo{
		Kind: "cancelled", Code: jetflowtype.CodeSuperseded, Fatal: true,
		Message: fmt.Sprintf("superseded by a newer start (source %q)", req.Source),
	})
	if err != nil || !written {
		return false, err
	}
	if h := a.hooks.AfterSupersede; h != nil {
		h(cancelled)
	}
	return true, a.finishCancel(ctx, cancelled, true)
}

// reread reads the record of runID as the stream leader holds it; a record
// that expired meanwhile is ErrRetryStart.
func (a *Admitter) reread(ctx context.Context, runID string) (state.Run, uint64, error) {
	latest, err := a.runs.Latest(ctx, runID)
	switch {
	case err != nil:
		return state.Run{}, 0, err
	case !latest.Live:
		return state.Run{}, 0, fmt.Errorf("%w: run %s expired while it was being superseded", ErrRetryStart, runID)
	}
	run, err := state.DecodeRun(latest.Value)
	return run, latest.Rev, err
}

// finishCancel tells the workers and the parent of the superseded
// generation run and cancels its children (SetCancelled). first is set for
// the start that cancelled it.
func (a *Admitter) finishCancel(ctx context.Context, run state.Run, first bool) error {
	if a.cancelled == nil {
		return nil
	}
	return a.cancelled(ctx, run, first)
}

// restart replaces the ended run old (at revision oldRev) by a new
// generation with the request's input, made with the start's token. The new generation's start task is
// published first, carrying oldRev, so that its receiver can finish the
// replacement if this process dies; then the record is replaced with
// compare-and-set on oldRev, which lets exactly one of many concurrent
// restarts win. It returns the record now stored and whether this call
// made the new generation (created), which a newer one may have replaced
// already when the task's receiver wrote it for this call.
func (a *Admitter) restart(ctx context.Context, req Request, token string, old state.Run, oldRev uint64) (admitted, error) {
	gen := old.Generation + 1
	traceParent := tracing.TraceParent(ctx)
	started := state.StartTask(state.Run{RunID: req.RunID, Workflow: req.Workflow, Input: req.Input, Token: token, Source: req.Source,
		Generation: gen, Retention: req.Retention, TraceParent: traceParent, Attributes: req.Attributes, Rerun: req.Rerun})
	started.PrevRev = oldRev
	task, err := state.Encode(started)
	if err != nil {
		return admitted{}, err
	}
	if err := a.publishStart(ctx, req.Workflow, state.RunIdentity(req.RunID, gen), task); err != nil {
		return admitted{}, err
	}
	if h := a.hooks.AfterRestartPublished; h != nil {
		h(req.RunID, gen)
	}
	rec, err := a.newRecord(req, token)
	if err != nil {
		return admitted{}, err
	}
	rec.Generation, rec.TraceParent, rec.Predecessors = gen, traceParent, old.Successors()
	stored, rev, err := a.replace(ctx, rec, oldRev)
	if err != nil {
		return admitted{}, err
	}
	return found(stored, rev, rec), nil
}

// replace writes rec over the record (or expiry marker) at revision oldRev
// and returns the record stored then. When the write is refused or its
// answer is lost, that is the record it reads: rec's own generation (by
// its token, see found) if the write landed or a start task's receiver
// wrote it, else another's. When the run ID's record has expired since
// oldRev, the error is ErrRetryStart.
func (a *Admitter) replace(ctx context.Context, rec state.Run, oldRev uint64) (state.Run, uint64, error) {
	if _, err := state.Encode(rec); err != nil {
		return state.Run{}, 0, err // before the write: its error says nothing of what is stored
	}
	rev, err := a.runs.Replace(ctx, rec, oldRev)
	if err == nil {
		return rec, rev, nil
	}
	if !errors.Is(err, jetstream.ErrRevisionMismatch) && jetstream.IsAPIError(err) {
		return state.Run{}, 0, err
	}
	// Latest reads from the stream leader: a write it does not show did
	// not land.
	latest, lerr := a.runs.Latest(ctx, rec.RunID)
	switch {
	case lerr != nil:
		return state.Run{}, 0, errors.Join(err, lerr)
	case !latest.Live && latest.Rev == oldRev:
		return state.Run{}, 0, err // the write got no answer and did not land
	case !latest.Live:
		return state.Run{}, 0, fmt.Errorf("%w: run %s expired at revision %d, after revision %d was read",
			ErrRetryStart, rec.RunID, latest.Rev, oldRev)
	}
	stored, err := state.DecodeRun(latest.Value)
	return stored, latest.Rev, err
}

// found is the admission of rec (by its token) that finds stored at rev.
// It created a generation when stored is rec's or lists rec's among the
// generations it replaced (Run.MadeBy): a start task's receiver may write
// a start's generation for it, and a newer start replace that, before the
// start reads what it made. mine is that generation, as stored or as it
// ended.
func found(stored state.Run, rev uint64, rec state.Run) admitted {
	gen, status, ok := stored.MadeBy(rec.Token)
	mine := stored
	if ok && stored.Token != rec.Token {
		mine = rec
		mine.Generation, mine.Status = gen, status
	}
	return admitted{run: stored, rev: rev, mine: mine, created: ok, afterExpiry: ok && mine.AfterExpiry}
}

// short abbreviates a fingerprint for messages.
func short(fp string) string {
	if len(fp) > 12 {
		return "fingerprint " + fp[:12]
	}
	return "fingerprint " + fp
}

// publishStart stores the start task of the run generation identity (the
// run ID for the first): subject and message ID are the identity, so each
// generation has its own start subject. A publish whose answer was lost is
// sent again, the same bytes under the same message ID, so a stored first
// copy absorbs it and the start keeps its token: the caller still learns
// that it created the run.
//
// The task stream also holds the tasks of an earlier engine
// (jetstream.LegacyTaskSubjects), whose start tasks carry the run ID as
// their message ID too: a publish answered "duplicate" may have met such a
// task, on another subject, and then this run would have none. So a
// duplicate answer is checked: when the message that holds the ID is on
// another subject, or no longer stored to tell, the task is published
// again under the message ID <identity>.start (logged at warn). A copy
// stored twice so costs nothing: the worker that receives the second finds
// the run held by the first's and drops it without a replay, or finds the
// run ended.
func (a *Admitter) publishStart(ctx context.Context, workflow, identity string, task []byte) error {
	subject := jetstream.RunSubject(workflow, identity)
	d, seq, err := a.publishRetried(ctx, subject, identity, task)
	if err != nil || d != jetstream.DuplicateMsgID {
		return err
	}
	held, err := jetstream.TaskAt(ctx, a.assets.JS, seq)
	if err != nil || held == subject {
		return err
	}
	alt := identity + ".start"
	a.log.Warn().Str("run_identity", identity).Str("subject", subject).Str("msg_id_held_by", held).Uint64("stream_seq", seq).
		Str("msg_id", alt).Msg("the start task's message ID is held by another task (an earlier engine's?): start task published again under another message ID")
	_, _, err = a.publishRetried(ctx, subject, alt, task)
	return err
}

// publishUntilDone is publishStart for the call that created the run: a
// transient failure (NATS restarting, a leader election) is tried again
// until ctx ends, since a record without its start task waits for a
// duplicate's repair (ensureStarted) or the sweeper.
func (a *Admitter) publishUntilDone(ctx context.Context, workflow, identity string, task []byte) error {
	wait := 50 * time.Millisecond
	for {
		err := a.publishStart(ctx, workflow, identity, task)
		if err == nil || ctx.Err() != nil || jetstream.IsAPIError(err) || !jetstream.IsTransient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// ensureStarted repairs a run whose creator stored its record and then
// failed to publish its start task (NATS restarted between the two, or the
// creator died): a duplicate start that finds res.Run running, a run of
// this engine that no delivery has ever held (its lease key was never
// written), publishes the run's start task from its record, under the
// run's identity as message ID. A start task still stored (the run not
// taken up yet, or held by its first delivery) refuses the copy (one task
// per run subject); one stored meanwhile by a first holder that parked
// after the lease read is a stray the worker drops without a replay; one
// that finds the run ended is dropped. A run that was held costs the one
// read of its lease key, and no publish (G25).
//
// A copy answered "duplicate" is not checked the way the creator's first
// publish is (publishStart): the run's creator published under the same
// message ID and checked whether an earlier engine's task held it, so the
// ID is held by the run's own start task, stored or already taken up by a
// worker (which writes the lease key the read above found missing).
// Republishing then would store a second task and a warning for every
// duplicate that races the first holder's lease write.
func (a *Admitter) ensureStarted(ctx context.Context, res Result) error {
	run := res.Run
	if !res.Stored || run.Status != state.StatusRunning || run.Exec != state.ExecLease {
		return nil
	}
	identity := state.RunIdentity(run.RunID, run.Generation)
	_, _, err := a.assets.Steps.Get(ctx, state.LeaseKey(identity))
	if !errors.Is(err, jetstream.ErrNotFound) {
		return err // held once (nil), or the read failed
	}
	task, err := state.Encode(state.StartTask(run))
	if err != nil {
		return err
	}
	_, _, err = a.publishRetried(ctx, jetstream.RunSubject(run.Workflow, identity), identity, task)
	return err
}

// publishRetried publishes task on subject under msgID, sending it again
// when its answer was lost (see publishStart).
func (a *Admitter) publishRetried(ctx context.Context, subject, msgID string, task []byte) (jetstream.Dedup, uint64, error) {
	wait := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		d, seq, err := jetstream.PublishTaskSeq(actx, a.assets.JS, subject, msgID, task)
		cancel()
		if err == nil || attempt == createAttempts || ctx.Err() != nil || jetstream.IsAPIError(err) {
			return d, seq, err
		}
		select {
		case <-ctx.Done():
			return d, seq, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// ErrInvalidRetention: a run retention under a second or longer than the
// deployment's.
var ErrInvalidRetention = errors.New("jetflow: invalid retention")

// ConflictError is a start whose run ID names an existing run that it does
// not match (jetflowtype's: it matches jetflowtype.ErrIdempotencyConflict).
// The existing run is untouched.
type ConflictError = jetflowtype.ConflictError

// Materialize returns the run record a start task stands for, creating it
// from the task if its publisher died before doing so. The stored record
// always wins: a task from a duplicate start never changes the run, and a
// task of an older generation advances the current one. A start task of a
// new generation whose publisher died before replacing the ended run
// finishes the replacement (compare-and-set on the revision it carries).
//
// It creates a record only where the run ID was never written: a start
// task that finds its run ID's record expired (a duplicate's task left in
// the stream, a task consumed after its run's retention) gets
// ErrStaleStart and must be dropped, since its start was answered by the
// run that expired. The one exception is the start task of the run created
// over that very expiry marker (AfterExpiry, Generation = the marker's
// revision) whose publisher died before replacing the marker: it finishes
// the replacement with compare-and-set on the marker.
func (a *Admitter) Materialize(ctx context.Context, t state.Task) (state.Run, uint64, error) {
	rec, err := a.newRecord(Request{RunID: t.RunID, Workflow: t.Workflow, Input: t.Input, Source: t.Source, Parent: t.Parent, Attributes: t.Attributes, Rerun: t.Rerun}, t.Token)
	if err != nil {
		return state.Run{}, 0, err
	}
	rec.Generation, rec.Retention, rec.AfterExpiry = t.Generation, t.Retention, t.AfterExpiry
	rec.TraceParent = t.TraceParent
	st, err := a.readOrCreate(ctx, rec, starter{task: &t})
	run, rev := st.run, st.rev
	if err != nil || t.Generation == 0 || run.Generation >= t.Generation {
		return run, rev, staleOnRetry(err)
	}
	if run.Generation == t.Generation-1 && run.Status.Terminal() && rev == t.PrevRev {
		rec.Predecessors = run.Successors()
		run, rev, err = a.replace(ctx, rec, rev)
	}
	return run, rev, staleOnRetry(err)
}

// staleOnRetry turns ErrRetryStart (a record that expired under a write)
// into ErrStaleStart: a worker never retries a start task over a marker.
func staleOnRetry(err error) error {
	if errors.Is(err, ErrRetryStart) {
		return fmt.Errorf("%w: %w", ErrStaleStart, err)
	}
	return err
}

func (a *Admitter) newRecord(req Request, token string) (state.Run, error) {
	fp, err := Fingerprint(req.Workflow, req.Input)
	if err != nil {
		return state.Run{}, err
	}
	now := a.now().UTC()
	return state.Run{
		V: state.Version, RunID: req.RunID, Workflow: req.Workflow, Input: req.Input,
		Status: state.StatusRunning, Token: token, Fingerprint: fp, Source: req.Source,
		Retention: req.Retention, CreatedAt: now, UpdatedAt: now, Parent: req.Parent,
		Attributes: req.Attributes, Exec: state.ExecLease, Rerun: req.Rerun,
	}, nil
}

// DefaultTimeout bounds a start whose context has no deadline, retries
// included.
const DefaultTimeout = 10 * time.Second

// attemptTimeout bounds one attempt of a write whose answer may be lost, so
// that a start has time to retry it (with the same token) within its own
// deadline.
const attemptTimeout = 2 * time.Second

// createAttempts bounds the retries of a run-record create that failed
// without an answer (timeout, reconnect).
const createAttempts = 5

// starter is who asks for a run record to be created; it decides whether
// the record may be created over the marker an expired record left (see
// readExisting).
type starter struct {
	// began is when the Admit call began (before it wrote anything). It
	// may create over a marker written before that.
	began time.Time
	// task is the start task a worker materialises (Materialize). It may
	// create over a marker only as the after-expiry run it stands for.
	task *state.Task
}

// admitted is the run record admission ended up with.
type admitted struct {
	// run is the record stored at revision rev.
	run state.Run
	rev uint64
	// created: this call made run's generation, or one that run
	// replaced since (found); mine is that generation.
	created bool
	mine    state.Run
	// afterExpiry: it was created over the marker of an expired record
	// with the same run ID.
	afterExpiry bool
}

// createOrRead writes rec if the run ID holds no record, else reads the
// stored one. A create that fails for another reason than a conflict is
// retried (the write may have landed, and the token tells). A run ID whose
// record expired (its retention passed) holds a marker: rec replaces it if
// by may create over it (see readExisting), and the result says so.
func (a *Admitter) createOrRead(ctx context.Context, rec state.Run, by starter) (admitted, error) {
	if _, err := state.Encode(rec); err != nil {
		return admitted{}, err // fails the same on every attempt: not retried
	}
	wait := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		rev, err := a.runs.Create(actx, rec)
		cancel()
		if err == nil {
			return admitted{run: rec, rev: rev, mine: rec, created: true}, nil
		}
		if errors.Is(err, jetstream.ErrExists) {
			st, again, err := a.readExisting(ctx, rec, by)
			if err != nil || !again {
				return st, err
			}
		} else if attempt == createAttempts || ctx.Err() != nil {
			return admitted{}, err
		}
		if attempt == createAttempts {
			return admitted{}, fmt.Errorf("jetflow: run %s: record keeps changing", rec.RunID)
		}
		select {
		case <-ctx.Done():
			return admitted{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// readExisting reads the record a create found in the way. again is true
// when there is none after all (a marker that itself expired meanwhile):
// the caller creates again.
//
// When the run ID's record expired, the start by creates a new run over
// the marker only if it cannot have been answered by the expired run: an
// Admit call that began after the record expired, or the start task of the
// after-expiry run itself (see Materialize). Otherwise it creates nothing:
// Admit gets ErrRetryStart, Materialize ErrStaleStart.
func (a *Admitter) readExisting(ctx context.Context, rec state.Run, by starter) (admitted, bool, error) {
	run, rev, latest, err := a.existing(ctx, rec.RunID)
	switch {
	case err != nil:
		return admitted{}, false, err
	case rev != 0:
		return found(run, rev, rec), false, nil
	case latest.Rev == 0:
		return admitted{}, true, nil
	case latest.Live: // a lagging replica missed it on the first read
		run, err := state.DecodeRun(latest.Value)
		if err != nil {
			return admitted{}, false, err
		}
		return found(run, latest.Rev, rec), false, nil
	}
	if t := by.task; t != nil {
		if !t.AfterExpiry || uint64(t.Generation) != latest.Rev {
			return admitted{}, false, fmt.Errorf("%w: run %s (generation %d) expired at revision %d after its start task was published",
				ErrStaleStart, rec.RunID, t.Generation, latest.Rev)
		}
		// The after-expiry run's own start task, whose publisher died
		// before replacing the marker: finish the replacement.
		rec.Generation, rec.AfterExpiry = t.Generation, true
		run, rev, err := a.replace(ctx, rec, latest.Rev)
		if err != nil {
			return admitted{}, false, err
		}
		return found(run, rev, rec), false, nil
	}
	if !latest.Time.Before(by.began) {
		// Expired after this call began: the call overlapped the run's
		// whole life, and was that run's start or a duplicate of it.
		return admitted{}, false, fmt.Errorf("%w: run %s expired at %s, after this start began at %s",
			ErrRetryStart, rec.RunID, latest.Time.UTC().Format(time.RFC3339Nano), by.began.UTC().Format(time.RFC3339Nano))
	}
	// The run ID's record expired before this start: it creates a new run
	// over its marker, and says so. The new run gets an identity of its own
	// (the marker's revision as its generation), so it never meets the
	// expired run's step results, which may outlive its record; and a start
	// task of its own, stored before the marker is replaced, as a new
	// generation's is (restart), so that a worker finishes the replacement
	// if this process dies in between (Materialize). A duplicate that finds
	// the new generation publishes nothing (Admit).
	rec.Generation, rec.AfterExpiry = int(latest.Rev), true
	task, err := state.Encode(state.StartTask(rec))
	if err != nil {
		return admitted{}, false, err
	}
	if err := a.publishStart(ctx, rec.Workflow, state.RunIdentity(rec.RunID, rec.Generation), task); err != nil {
		return admitted{}, false, err
	}
	// Compare-and-set on the marker; a lost answer is resolved by the token.
	run, rev, err = a.replace(ctx, rec, latest.Rev)
	if err != nil {
		return admitted{}, false, err
	}
	return found(run, rev, rec), false, nil
}

// existing reads the record of runID, which a create found there: the
// record at its revision (not 0), or, when it has expired, its marker as
// the bucket's last message of the key (not Live; Rev 0 when the marker
// has gone too; Live when a lagging replica missed the record). A record the bucket still holds
// past its retention (a removal undone by an unclean stop of the server)
// counts as expired at the time its retention ended, and its revision as
// the marker's.
func (a *Admitter) existing(ctx context.Context, runID string) (state.Run, uint64, jetstream.KeyState, error) {
	run, rev, err := a.runs.Get(ctx, runID)
	if err == nil {
		if at, expired := a.runs.Expired(run, time.Now()); expired {
			return state.Run{}, 0, jetstream.KeyState{Rev: rev, Time: at}, nil
		}
		return run, rev, jetstream.KeyState{}, nil
	}
	if !errors.Is(err, runs.ErrNotFound) {
		return state.Run{}, 0, jetstream.KeyState{}, err
	}
	latest, err := a.runs.Latest(ctx, runID)
	return state.Run{}, 0, latest, err
}

// readOrCreate reads the stored record and falls back to createOrRead when
// there is none.
func (a *Admitter) readOrCreate(ctx context.Context, rec state.Run, by starter) (admitted, error) {
	run, rev, err := a.runs.Get(ctx, rec.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		return a.createOrRead(ctx, rec, by)
	}
	if err != nil {
		return admitted{}, err
	}
	if _, expired := a.runs.Expired(run, time.Now()); expired {
		// Held past its retention: its create fails, and the record is
		// then taken for its marker (existing).
		return a.createOrRead(ctx, rec, by)
	}
	return found(run, rev, rec), nil
}
