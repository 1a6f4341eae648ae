// Package state defines the records jetflow keeps on NATS: the run record in
// the runs bucket, the step record in the steps bucket, the duplicate audit
// record and the task message that drives a run. It owns their encoding and
// the validation of every identifier that becomes part of a subject or a key,
// so that no other package decodes outside bytes on its own.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/jetflowtype"
)

// Status is the lifecycle state of a run: jetflowtype.RunStatus (the root
// package's RunStatus), named here for the engine. Its Terminal reports a
// final state.
type Status = jetflowtype.RunStatus

// Run states. A run is created running; completed, failed and cancelled are
// terminal and never change again. A blocked run is running, but its body
// diverged from its history and no step runs until compatible code or an
// operator resumes it (Run.Block).
const (
	StatusRunning   = jetflowtype.StatusRunning
	StatusBlocked   = jetflowtype.StatusBlocked
	StatusCompleted = jetflowtype.StatusCompleted
	StatusFailed    = jetflowtype.StatusFailed
	StatusCancelled = jetflowtype.StatusCancelled
)

// ValidStatus reports whether s is one of the known states.
func ValidStatus(s Status) bool {
	return s.Active() || s.Terminal()
}

// Version is the schema version written into every record.
const Version = 1

// EngineProtocol is the engine protocol this version speaks: what its
// workers put on the wire and in records, and expect of the other workers
// of the deployment. 1 was the executor that ran a run step task by step
// task (runs without Exec), 2 the lease executor before runs could be
// blocked, pinned or patched; this version is 3. A worker records it in
// its liveness records (roster.Live.Protocol: none before 3), and executes
// nothing while a worker of another protocol is live (docs/operations.md,
// "Upgrading the engine").
const EngineProtocol = 3

// ErrorInfo is an error as it is stored: its message and whether it was
// fatal (not retried).
type ErrorInfo struct {
	Message string `json:"message"`
	Fatal   bool   `json:"fatal,omitempty"`
	// Kind names the class of the error: "step" for a step's final failure
	// that the workflow did not handle, "workflow" for an error the workflow
	// returned, "input" when the input could not be decoded, "panic".
	Kind string `json:"kind,omitempty"`
	// Code is the error's own code, when the error that failed the step or
	// the workflow carried one (an ErrorCode() string method): what a
	// workflow or a caller branches on, e.g. "card_declined".
	Code string `json:"code,omitempty"`
}

// Run is the run record, stored under the run ID in the runs bucket. It is
// created once with create-if-absent (the admission authority) and updated
// only with compare-and-set on its revision.
type Run struct {
	V        int             `json:"v"`
	RunID    string          `json:"run_id"`
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input"`
	Status   Status          `json:"status"`
	// Token identifies the start call that created the record, so that a
	// retried create after a lost reply recognises its own write.
	Token string `json:"token"`
	// Fingerprint is the canonical hash of workflow name and input; a
	// duplicate start is compared against it.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Generation counts the runs started under this run ID by the conflict
	// policy's "start new" (0 for the first).
	Generation int `json:"generation,omitempty"`
	// Retention is how long the record is kept after the run ended: the
	// final write carries this TTL (0: the deployment's retention), while
	// every write of a running run carries the TTL "never".
	Retention time.Duration `json:"retention,omitempty"`
	// AfterExpiry: the record was created over the marker of an expired
	// run with the same run ID (its creator is told so).
	AfterExpiry bool            `json:"after_expiry,omitempty"`
	Source      string          `json:"source,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       *ErrorInfo      `json:"error,omitempty"`
	// Parent links a child run to the run that started it; nil for a run
	// started from outside.
	Parent *ParentLink `json:"parent,omitempty"`
	// Children are the child runs this run started, in the order their
	// starts were recorded.
	Children []ChildLink `json:"children,omitempty"`
	// TraceParent is the W3C trace context (traceparent form) of the start
	// that created the run; its tasks carry it (internal/tracing).
	TraceParent string `json:"traceparent,omitempty"`
	// Attributes are the business keys the start that created the run
	// attached (ValidateAttributes): the run index lists runs by them.
	// They never change: a duplicate start's attributes are ignored.
	Attributes map[string]string `json:"attributes,omitempty"`
	// Predecessors are the latest generations this record's generation
	// replaced under the run ID, oldest first, at most MaxPredecessors
	// (Successors). A start whose own generation was written for it (a
	// worker finished the replacement its start task asked for) or whose
	// write's answer was lost finds its token here when a newer
	// generation already replaced its own (MadeBy).
	Predecessors []Predecessor `json:"predecessors,omitempty"`
	// Exec is the executor the run was started for: ExecLease for every
	// run this version admits. A record without it was admitted by the
	// executor before the lease, which ran it step task by step task; a
	// worker of this version takes such a run over (writes ExecLease) when
	// the run's next message of that executor is delivered (see
	// docs/operations.md, "Upgrading the engine").
	Exec int `json:"exec,omitempty"`
	// Adopted marks a run that the executor before the lease admitted and
	// a worker of this version took over: its history began without a
	// lease, so no task of it is ever its fresh start (startRole), and the
	// message IDs of its branch tasks and timers differ from the ones that
	// executor gave its step tasks and timers (TaskMsgID).
	Adopted bool `json:"adopted,omitempty"`
	// Block says why the run is blocked (Status blocked): the divergence
	// report of the replay that found its code departing from its
	// history. Nil otherwise.
	Block *jetflowtype.RunBlock `json:"block,omitempty"`
	// WaivedRev is, for each step of Waived, the revision of the record
	// that was waived in the steps bucket (0: none was committed, a step
	// the run waited for): only that record is left out of replays; the
	// step's record the code commits after it counts.
	WaivedRev map[string]uint64 `json:"waived_rev,omitempty"`
	// Waived are the steps of the run's history that an operator told the
	// run to go on without (ResumeRun accepting a divergence): a replay
	// neither compares the code with them nor returns their results, so
	// the code's step at such a place runs (again).
	Waived []string `json:"waived,omitempty"`
	// Build is the build identity of the worker that started the run: the
	// first to park it or to end it records it. A workflow registered
	// pinned runs only on workers of this build.
	Build string `json:"build,omitempty"`
	// Rerun links a run started by a rerun (jetflow's Client.Rerun) to
	// the run whose committed steps before a step it takes as its own;
	// nil for any other run.
	Rerun *RerunLink `json:"rerun_of,omitempty"`
}

// RerunLink is what a run started by a rerun knows of its source: the
// source run generation, the step it reruns from and the place of that
// step in the source's history. Every holder of the run makes sure that,
// before its body replays, the source's records placed before Before
// (and the source's patch markers) are committed as the run's own, under
// its own step IDs; Records is how many that is, so that a holder that
// finds fewer (the source's records expired) fails the run instead of
// running a step again.
type RerunLink struct {
	RunID      string `json:"run_id"`
	Generation int    `json:"generation,omitempty"`
	// From is the step ID, in the source, of the first step run again
	// ("": the step after the source's last committed one).
	From    string `json:"from,omitempty"`
	Before  int    `json:"before"`
	Records int    `json:"records"`
}

// StartTask is the start task of the run record r: what a worker needs to
// create the record if its publisher died before it (Materialize), and to
// run it.
func StartTask(r Run) Task {
	return Task{
		V: Version, RunID: r.RunID, Workflow: r.Workflow, Input: r.Input, Token: r.Token,
		Source: r.Source, Generation: r.Generation, Retention: r.Retention, AfterExpiry: r.AfterExpiry,
		Parent: r.Parent, TraceParent: r.TraceParent, Attributes: r.Attributes, Rerun: r.Rerun,
	}
}

// TaskMsgID is the message ID of a branch task or a timer of run r whose
// own ID is id (a step ID, or a step ID with a #suffix). The executor
// before the lease gave its step tasks and timers the same IDs (a step's
// task its step ID, a wait's timer <step-id>#wake, a retry
// <step-id>#<attempt>), and the broker drops a message whose ID it saw
// within its duplicate window: a run taken over from it (Adopted) has
// its IDs under ".adopted", so that none of its messages is taken for
// one of that executor's.
func TaskMsgID(r Run, id string) string {
	if r.Adopted {
		return id + ".adopted"
	}
	return id
}

// ExecLease is Run.Exec of a run whose body one lease holder executes at a
// time (internal/workflow).
const ExecLease = 2

// Predecessor is a generation that a newer one replaced: who made it (the
// token of its start) and how it ended.
type Predecessor struct {
	Generation int    `json:"g"`
	Token      string `json:"t"`
	Status     Status `json:"s"`
	// Ended is when it ended (its record's UpdatedAt), from which its
	// records' retention counts; zero in records of earlier versions.
	Ended time.Time `json:"e,omitzero"`
}

// MaxPredecessors bounds Run.Predecessors. A start that looks for its
// generation after more than this many newer ones replaced it cannot tell
// whether it made one.
const MaxPredecessors = 32

// Successors is the Predecessors of the generation that replaces r: r's
// own, then r itself, the oldest dropped beyond MaxPredecessors.
func (r Run) Successors() []Predecessor {
	ps := append(r.Predecessors[:len(r.Predecessors):len(r.Predecessors)],
		Predecessor{Generation: r.Generation, Token: r.Token, Status: r.Status, Ended: r.UpdatedAt})
	return ps[max(0, len(ps)-MaxPredecessors):]
}

// MadeBy reports whether the start call with token made r's generation or
// one that r lists among its predecessors, and that generation's number
// and status (the latter as it ended, for a predecessor). An empty token
// made nothing.
func (r Run) MadeBy(token string) (generation int, status Status, ok bool) {
	if token == "" {
		return 0, "", false
	}
	if r.Token == token {
		return r.Generation, r.Status, true
	}
	for _, p := range r.Predecessors {
		if p.Token == token {
			return p.Generation, p.Status, true
		}
	}
	return 0, "", false
}

// ParentLink is what a child run knows of its parent: enough to commit the
// parent's child step when the child ends and to publish the parent's task.
type ParentLink struct {
	RunID      string `json:"run_id"`
	Workflow   string `json:"workflow"`
	Token      string `json:"token"`
	Generation int    `json:"generation,omitempty"`
	// StepID is the parent's step that stands for the child: its record
	// is the child's result.
	StepID string `json:"step_id"`
	// Seq is that step's place in the parent's history (Step.Seq).
	Seq int `json:"seq,omitempty"`
	// Detached: the child is not cancelled with its parent.
	Detached bool `json:"detached,omitempty"`
}

// validate checks a link decoded from a message; nil is valid (no parent).
func (p *ParentLink) validate() error {
	if p == nil {
		return nil
	}
	if err := ValidateRunID(p.RunID); err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	if err := ValidateName(p.Workflow); err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	if p.Generation < 0 {
		return fmt.Errorf("parent: generation %d", p.Generation)
	}
	if _, err := validateStepID(p.RunID, p.StepID); err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	return nil
}

// ChildLink is a child run in its parent's record.
type ChildLink struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	StepID   string `json:"step_id"`
	Detached bool   `json:"detached,omitempty"`
}

// Step is the committed result of one step, stored under its step ID in the
// steps bucket with create-if-absent. Once written it never changes.
type Step struct {
	V         int             `json:"v"`
	StepID    string          `json:"step_id"`
	RunID     string          `json:"run_id"`
	Name      string          `json:"name"`
	Seq       int             `json:"seq"`
	Attempt   int             `json:"attempt"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     *ErrorInfo      `json:"error,omitempty"`
	Worker    string          `json:"worker,omitempty"`
	Committed time.Time       `json:"committed_at"`
	// StartedAt is when the committed attempt started; Failures the
	// earlier attempts that failed and were retried (from the step's
	// AttemptLog at commit, oldest first).
	StartedAt time.Time        `json:"started_at,omitzero"`
	Failures  []AttemptFailure `json:"failures,omitempty"`
	// Child is the run ID of the child run the step stands for.
	Child string `json:"child,omitempty"`
	// Kind is what the step waited for, when it ran no function: StepSleep,
	// StepEvent or StepHook (a child step has Child set instead).
	Kind string `json:"kind,omitempty"`
	// WakeAt is a sleep's deadline, or a wait's timeout.
	WakeAt time.Time `json:"wake_at,omitzero"`
	// EventID is the ID of the event a wait's record holds (Output is its
	// payload); HookToken the token a hook wait was addressed by.
	EventID   string `json:"event_id,omitempty"`
	HookToken string `json:"hook_token,omitempty"`
	// TraceParent is the W3C trace context of the delivery that committed
	// an event's record (its jetflow.event.deliver span, or its caller's
	// span), for the wait's span to link to; empty without one.
	TraceParent string `json:"traceparent,omitempty"`
	// Build is the build identity of the worker that committed the step
	// (empty when it had none, or for an event, which its sender commits).
	Build string `json:"build,omitempty"`
	// Rev is the record's revision in the steps bucket (not stored): all
	// steps share one stream, so it orders commits.
	Rev uint64 `json:"-"`
}

// Kinds of steps that run no function (Step.Kind).
const (
	StepSleep = "sleep"
	// StepPatch is a patch marker's (PatchStepName): the run took the
	// patched code's way at that point. It has no place (Seq).
	StepPatch = "patch"
	StepEvent = "event"
	StepHook  = "hook"
)

// Hook is the record of a hook token, stored under the token in the hooks
// bucket with create-if-absent when a run first waits on it: the one
// wait (a run's step) that the token resumes. A token is single-use: its
// record is never moved to another wait.
type Hook struct {
	V          int    `json:"v"`
	Token      string `json:"token"`
	RunID      string `json:"run_id"`
	Workflow   string `json:"workflow"`
	RunToken   string `json:"run_token"`
	Generation int    `json:"generation,omitempty"`
	// StepID is the waiting step; Event its event name.
	StepID    string    `json:"step_id"`
	Event     string    `json:"event"`
	CreatedAt time.Time `json:"created_at"`
}

// DecodeHook decodes and validates a hook record.
func DecodeHook(b []byte) (Hook, error) {
	var h Hook
	if err := decode(b, &h); err != nil {
		return Hook{}, err
	}
	if err := ValidateHookToken(h.Token); err != nil {
		return Hook{}, fmt.Errorf("%w: hook record: %w", ErrCorrupt, err)
	}
	if err := ValidateRunID(h.RunID); err != nil {
		return Hook{}, fmt.Errorf("%w: hook record: %w", ErrCorrupt, err)
	}
	if err := ValidateName(h.Workflow); err != nil {
		return Hook{}, fmt.Errorf("%w: hook record: %w", ErrCorrupt, err)
	}
	if err := ValidateName(h.Event); err != nil {
		return Hook{}, fmt.Errorf("%w: hook record: %w", ErrCorrupt, err)
	}
	if _, err := validateStepID(h.RunID, h.StepID); err != nil || h.Generation < 0 {
		return Hook{}, fmt.Errorf("%w: hook record: step %q, generation %d", ErrCorrupt, clip(h.StepID), h.Generation)
	}
	if err := checkTimes("hook record", h.CreatedAt); err != nil {
		return Hook{}, err
	}
	return h, nil
}

// AuditRecent is how many of the most recent duplicate attempts a run's
// audit keeps, besides the first one and the total count.
const AuditRecent = 10

// Audit outcomes.
const (
	AuditExisting  = "existing"  // absorbed: the caller got the existing run
	AuditConflict  = "conflict"  // refused: another workflow or input
	AuditRejected  = "rejected"  // refused by the conflict policy
	AuditRestarted = "restarted" // the run had ended; the policy started a new one
	// AuditSuperseded: the run was running; the policy cancelled its
	// generation and started a new one with this start's input.
	AuditSuperseded = "superseded"
)

// AuditEntry is one duplicate start attempt.
type AuditEntry struct {
	At     time.Time `json:"at"`
	Source string    `json:"source,omitempty"`
	// Outcome is AuditExisting or AuditConflict.
	Outcome string `json:"outcome"`
	// FingerprintMatch is whether workflow and input matched the run's.
	FingerprintMatch bool `json:"fingerprint_match"`
	// Status is the run's state the attempt saw.
	Status Status `json:"status,omitempty"`
	// Generation is the generation of the run the attempt was answered
	// with: the one it started (restarted, superseded) or the one it got.
	Generation int `json:"generation,omitempty"`
}

// Audit records the duplicate starts a run has absorbed or refused: their
// count, the first one, and the most recent ones (bounded).
type Audit struct {
	V          int          `json:"v"`
	Duplicates int64        `json:"duplicates"`
	First      *AuditEntry  `json:"first,omitempty"`
	Recent     []AuditEntry `json:"recent,omitempty"` // oldest first, at most AuditRecent
	// Reruns are the runs started as reruns of this run (Run.Rerun),
	// oldest first, at most AuditRecent.
	Reruns []RerunEntry `json:"reruns,omitempty"`
}

// RerunEntry is one rerun of a run, in the source run's audit.
type RerunEntry struct {
	At         time.Time `json:"at"`
	RunID      string    `json:"run_id"`
	Generation int       `json:"generation,omitempty"`
	From       string    `json:"from"`
	Source     string    `json:"source,omitempty"`
}

// AddRerun records one more rerun, keeping the list bounded.
func (a *Audit) AddRerun(e RerunEntry) {
	a.Reruns = append(a.Reruns, e)
	if len(a.Reruns) > AuditRecent {
		a.Reruns = append(a.Reruns[:0:0], a.Reruns[len(a.Reruns)-AuditRecent:]...)
	}
}

// Add records one more attempt, keeping the audit bounded.
func (a *Audit) Add(e AuditEntry) {
	a.Duplicates++
	if a.First == nil {
		first := e
		a.First = &first
	}
	a.Recent = append(a.Recent, e)
	if len(a.Recent) > AuditRecent {
		a.Recent = append(a.Recent[:0:0], a.Recent[len(a.Recent)-AuditRecent:]...)
	}
}

// Task is the message on a workflow's task subject. A start task (StepID
// empty) carries everything needed to create the run record, so that an
// accepted start is never lost even if its publisher dies before creating
// the record. A step task names the step it was published for and carries
// the run record's fields as the publishing worker read them, with their
// revision, so that the worker finishing the run can write the final state
// with one compare-and-set and no read.
type Task struct {
	V         int             `json:"v"`
	RunID     string          `json:"run_id"`
	Workflow  string          `json:"workflow"`
	StepID    string          `json:"step_id,omitempty"`
	Input     json.RawMessage `json:"input"`
	Token     string          `json:"token,omitempty"`
	Source    string          `json:"source,omitempty"`
	CreatedAt time.Time       `json:"created_at,omitzero"`
	// Fingerprint is the run record's (step tasks only).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Generation is the run generation the task belongs to. A start task
	// of a later generation also carries PrevRev, the revision of the
	// ended run it replaces, so whoever receives it can finish the
	// replacement with compare-and-set if its publisher died first.
	Generation int    `json:"generation,omitempty"`
	PrevRev    uint64 `json:"prev_rev,omitempty"`
	// Retention is the run record's.
	Retention time.Duration `json:"retention,omitempty"`
	// AfterExpiry is the run record's (step tasks). On a start task it
	// says that the run is created over the marker its expired predecessor
	// left, at revision Generation (see dedupe.Admitter.Materialize).
	AfterExpiry bool `json:"after_expiry,omitempty"`
	// Rev is the run record's revision the fields above were read at; zero
	// on a start task.
	Rev uint64 `json:"rev,omitempty"`
	// Attempt is the attempt the first delivery of this message runs (0
	// means 1). A retry after a failed attempt n is a new message, stored
	// as a timer and published when its backoff has passed, with Attempt
	// n+1.
	Attempt int `json:"attempt,omitempty"`
	// Redispatched marks a branch task published by anyone but the body
	// that first reached it (a replay after a redelivery): its receiver
	// checks, before the step runs, that no retry of the step is waiting
	// as a timer and which attempt it would be.
	Redispatched bool `json:"redispatched,omitempty"`
	// Upto is, on a branch task, the revision of the steps bucket up to
	// which the holder that published it knew the run's records: the
	// branch replays the body against the records written up to there,
	// which reach its step the way the holder did, and reads the rest
	// only if they do not (0: the holder knew no record, and the branch
	// reads none).
	Upto uint64 `json:"upto,omitempty"`
	// Width is, on a branch task, how many branch tasks its holder
	// published with it: a branch of a fan-out wider than its run can be
	// checked for in one read wakes the run without checking (0: unknown).
	Width int `json:"width,omitempty"`
	// Parent is the run record's (a child run's tasks).
	Parent *ParentLink `json:"parent,omitempty"`
	// Resume marks a resume task of an earlier version's executor (a run
	// without Exec), published on its legacy subjects when this version
	// delivers an event or a child's end to such a run.
	Resume bool `json:"resume,omitempty"`
	// Wake marks a run task that is not the run's start: it hands the
	// run's body to a holder again (see workflow.Wake). It carries the run
	// record's fields, as a branch task does, and StepID names the step
	// it is about: the step a timer was stored for (WakeAt, Attempt or
	// Recheck set), or the step someone else committed (a branch, an
	// event, a child's end); empty for a sweep.
	Wake bool `json:"wake,omitempty"`
	// WakeAt marks the wake a sleep or a wait's timeout stored as a timer:
	// its step is due at WakeAt, not before.
	WakeAt time.Time `json:"wake_at,omitzero"`
	// Recheck marks the wake a wait without a deadline stored as a timer
	// to be delivered again (workflow.WaitRecheck).
	Recheck bool `json:"recheck,omitempty"`
	// TraceParent is the start's W3C trace context (a start task) or the
	// run record's (a step task).
	TraceParent string `json:"traceparent,omitempty"`
	// Attributes are the start's (a start task) or the run record's (a
	// step task).
	Attributes map[string]string `json:"attributes,omitempty"`
	// Exec and Adopted are the run record's (Run.Exec, Run.Adopted).
	Exec    int  `json:"exec,omitempty"`
	Adopted bool `json:"adopted,omitempty"`
	// Build is the run record's (Run.Build); for a branch task of a
	// pinned workflow's run, the build of the holder that published it:
	// only a worker of that build runs it.
	Build string `json:"build,omitempty"`
	// Rerun is the run record's (Run.Rerun).
	Rerun *RerunLink `json:"rerun_of,omitempty"`
}

// StepTask is the task of stepID in the running run r, read at revision
// rev: it carries every stored field of r, so that RunFromTask gives r back
// and the run's final write (which starts from it) loses none of them —
// except its children and predecessors, which can be many: the task of a
// run with either carries no revision, so that its final write reads the
// record first.
func StepTask(r Run, rev uint64, stepID string) Task {
	if len(r.Children) > 0 || len(r.Predecessors) > 0 || r.Block != nil || len(r.Waived) > 0 {
		rev = 0 // not carried: the run's writers read the record first
	}
	return Task{
		V: Version, RunID: r.RunID, Workflow: r.Workflow, StepID: stepID, Input: r.Input,
		Token: r.Token, Fingerprint: r.Fingerprint, Source: r.Source, CreatedAt: r.CreatedAt, Rev: rev,
		Generation: r.Generation, Retention: r.Retention, AfterExpiry: r.AfterExpiry, Parent: r.Parent,
		TraceParent: r.TraceParent, Attributes: r.Attributes, Exec: r.Exec, Adopted: r.Adopted, Build: r.Build,
		Rerun: r.Rerun,
	}
}

// RunFromTask rebuilds the running run record a step task carries (see
// StepTask); UpdatedAt is the run's creation time.
func RunFromTask(t Task) Run {
	return Run{
		V: Version, RunID: t.RunID, Workflow: t.Workflow, Input: t.Input, Status: StatusRunning,
		Token: t.Token, Fingerprint: t.Fingerprint, Generation: t.Generation, Retention: t.Retention,
		AfterExpiry: t.AfterExpiry, Source: t.Source, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt,
		Parent: t.Parent, TraceParent: t.TraceParent, Attributes: t.Attributes, Exec: t.Exec, Adopted: t.Adopted, Build: t.Build,
		Rerun: t.Rerun,
	}
}

// ErrCorrupt is returned when stored or received bytes do not decode into a
// valid record.
var ErrCorrupt = errors.New("jetflow: malformed record")

// Encode marshals a record. It does not HTML-escape, so an input or output
// (json.RawMessage) is never made longer than it was, only compacted. A
// record larger than MaxRecordBytes, or a start task (a Task without a step
// ID) larger than MaxStartTaskBytes, would not fit in a NATS message and is
// refused with ErrInputTooLarge (see the limits in ids.go). Any other error
// is a programming error, returned rather than hidden.
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("jetflow: encode record: %w", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	limit, what := MaxRecordBytes, "record"
	switch t := v.(type) {
	case Task:
		if t.StepID == "" {
			limit, what = MaxStartTaskBytes, "start task"
		}
	case *Task:
		if t != nil && t.StepID == "" {
			limit, what = MaxStartTaskBytes, "start task"
		}
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%w: encoded %s is %d bytes, limit %d", ErrInputTooLarge, what, len(b), limit)
	}
	return b, nil
}

// DecodeRun decodes and validates a run record.
func DecodeRun(b []byte) (Run, error) {
	var r Run
	if err := decode(b, &r); err != nil {
		return Run{}, err
	}
	if err := ValidateRunID(r.RunID); err != nil {
		return Run{}, fmt.Errorf("%w: run record: %w", ErrCorrupt, err)
	}
	if err := ValidateName(r.Workflow); err != nil {
		return Run{}, fmt.Errorf("%w: run record: %w", ErrCorrupt, err)
	}
	if !ValidStatus(r.Status) {
		return Run{}, fmt.Errorf("%w: run record: unknown status %q", ErrCorrupt, r.Status)
	}
	if r.Generation < 0 || r.Retention < 0 {
		return Run{}, fmt.Errorf("%w: run record: negative generation or retention", ErrCorrupt)
	}
	if err := checkTimes("run record", r.CreatedAt, r.UpdatedAt); err != nil {
		return Run{}, err
	}
	return r, nil
}

// DecodeStep decodes and validates a step record.
func DecodeStep(b []byte) (Step, error) {
	var s Step
	if err := decode(b, &s); err != nil {
		return Step{}, err
	}
	if s.StepID == "" || s.RunID == "" || s.Name == "" {
		return Step{}, fmt.Errorf("%w: step record without identity", ErrCorrupt)
	}
	if err := ValidateRunID(s.RunID); err != nil {
		return Step{}, fmt.Errorf("%w: step record: %w", ErrCorrupt, err)
	}
	name, err := validateStepID(s.RunID, s.StepID)
	if err != nil {
		return Step{}, fmt.Errorf("%w: step record: %w", ErrCorrupt, err)
	}
	if name != s.Name {
		return Step{}, fmt.Errorf("%w: step record %q names step %q", ErrCorrupt, clip(s.StepID), clip(s.Name))
	}
	if s.Seq < 0 || s.Attempt < 0 {
		return Step{}, fmt.Errorf("%w: step record %q: negative seq or attempt", ErrCorrupt, s.StepID)
	}
	if err := checkTimes("step record", s.Committed, s.WakeAt); err != nil {
		return Step{}, err
	}
	return s, nil
}

// DecodeAudit decodes an audit record.
func DecodeAudit(b []byte) (Audit, error) {
	var a Audit
	if err := decode(b, &a); err != nil {
		return Audit{}, err
	}
	switch {
	case a.Duplicates < 0:
		return Audit{}, fmt.Errorf("%w: negative duplicate count", ErrCorrupt)
	case len(a.Recent) > AuditRecent:
		return Audit{}, fmt.Errorf("%w: audit keeps %d recent entries, limit %d", ErrCorrupt, len(a.Recent), AuditRecent)
	case int64(len(a.Recent)) > a.Duplicates || (a.First != nil) != (a.Duplicates > 0):
		return Audit{}, fmt.Errorf("%w: audit entries do not match its count %d", ErrCorrupt, a.Duplicates)
	}
	entries := a.Recent
	if a.First != nil {
		entries = append([]AuditEntry{*a.First}, entries...)
	}
	for _, e := range entries {
		switch e.Outcome {
		case AuditExisting, AuditConflict, AuditRejected, AuditRestarted, AuditSuperseded:
		default:
			return Audit{}, fmt.Errorf("%w: audit outcome %q", ErrCorrupt, e.Outcome)
		}
		if e.Status != "" && !ValidStatus(e.Status) {
			return Audit{}, fmt.Errorf("%w: audit status %q", ErrCorrupt, e.Status)
		}
		if err := checkTimes("audit entry", e.At); err != nil {
			return Audit{}, err
		}
	}
	return a, nil
}

// DecodeTask decodes and validates a task message.
func DecodeTask(b []byte) (Task, error) {
	var t Task
	if err := decode(b, &t); err != nil {
		return Task{}, err
	}
	if err := ValidateRunID(t.RunID); err != nil {
		return Task{}, fmt.Errorf("%w: task: %w", ErrCorrupt, err)
	}
	if err := ValidateName(t.Workflow); err != nil {
		return Task{}, fmt.Errorf("%w: task: %w", ErrCorrupt, err)
	}
	if t.StepID == "" && t.Token == "" {
		return Task{}, fmt.Errorf("%w: start task without token", ErrCorrupt)
	}
	if t.StepID != "" {
		if _, err := validateStepID(t.RunID, t.StepID); err != nil {
			return Task{}, fmt.Errorf("%w: task: %w", ErrCorrupt, err)
		}
	}
	if t.Attempt < 0 {
		return Task{}, fmt.Errorf("%w: task: attempt %d", ErrCorrupt, t.Attempt)
	}
	if t.Generation < 0 || t.Retention < 0 || (t.PrevRev != 0 && (t.Generation == 0 || t.StepID != "")) {
		return Task{}, fmt.Errorf("%w: task: generation %d with previous revision %d", ErrCorrupt, t.Generation, t.PrevRev)
	}
	if len(t.Input) == 0 { // json.Unmarshal has validated it when present
		return Task{}, fmt.Errorf("%w: task without input", ErrCorrupt)
	}
	if err := t.Parent.validate(); err != nil {
		return Task{}, fmt.Errorf("%w: task: %w", ErrCorrupt, err)
	}
	if err := checkTimes("task", t.CreatedAt, t.WakeAt); err != nil {
		return Task{}, err
	}
	return t, nil
}

// checkTimes rejects timestamps that decode but cannot be encoded again:
// time.Time accepts a zone offset of 24 hours when it decodes and refuses
// it when it encodes. Without this check a record carrying one would decode
// and then never be written back (a run that could never finish, an audit
// that could never count another duplicate).
func checkTimes(what string, ts ...time.Time) error {
	for _, t := range ts {
		if _, err := t.MarshalJSON(); err != nil {
			return fmt.Errorf("%w: %s: timestamp %s: %w", ErrCorrupt, what, t.Format(time.RFC3339Nano), err)
		}
	}
	return nil
}

func decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return nil
}
