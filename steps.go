package jetflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// StepRecord is one committed step of a run. Its JSON encoding is the
// step as the HTTP API and the producer's --output json show it.
type StepRecord struct {
	StepID string `json:"step_id"`
	Name   string `json:"name"`
	// Seq is the step's place in the run's history; it is not encoded (a
	// list of steps is in this order).
	Seq     int             `json:"-"`
	Attempt int             `json:"attempt"`
	Output  json.RawMessage `json:"output,omitempty"`
	// Error is the message of a committed failure; Fatal says it was not
	// retried.
	Error string `json:"error,omitempty"`
	Fatal bool   `json:"fatal,omitempty"`
	// Code is the code of a committed failure (StepError.Code): the code
	// the step failed with (ErrorWithCode), or a wait's CodeEventTimeout
	// (its timeout passed: an outcome, not a fault) or CodeHookTaken.
	Code string `json:"code,omitempty"`
	// Worker names the worker whose attempt was committed. For a result
	// served from a task key it goes on with " (served from task key
	// <key>, result of <step ID>)"; read TaskKey rather than this text.
	Worker string `json:"worker,omitempty"`
	// Build is the build identity of that worker (WorkerConfig.Build).
	Build       string    `json:"build,omitempty"`
	CommittedAt time.Time `json:"committed_at"`
	// StartedAt is when the committed attempt started (zero for a step
	// that ran no function, and for records written before it was kept).
	StartedAt time.Time `json:"started_at,omitzero"`
	// Attempts are the earlier attempts of the step that failed and were
	// retried, oldest first (the last ten).
	Attempts []StepAttempt `json:"attempts,omitempty"`
	// TaskKey is set for a step called with a task idempotency key
	// (WithTaskKey): the key, and whether the result was served
	// from its cache and from which step. Nil for a step without a key.
	TaskKey *StepTaskKey `json:"task_key,omitempty"`
	// Child is the child run a child step (Child) stands for.
	Child string `json:"child,omitempty"`
	// Kind is "sleep" for a sleep, "event" or "hook" for a wait for an
	// event, "patch" for a patch marker (Patched: the run took the
	// patched way), empty for a step that ran a function or a child.
	Kind string `json:"kind,omitempty"`
	// WakeAt is a sleep's deadline, or a wait's timeout.
	WakeAt time.Time `json:"wake_at,omitzero"`
	// EventID is the ID of the event a wait holds (its Output is the
	// payload); HookToken the token of a hook wait.
	EventID   string `json:"event_id,omitempty"`
	HookToken string `json:"hook_token,omitempty"`
}

// StepAttempt is one failed attempt of a step, which was retried.
type StepAttempt struct {
	Attempt   int       `json:"attempt"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	// Worker names the worker that ran the attempt.
	Worker string `json:"worker,omitempty"`
	Error  string `json:"error"`
}

func toAttempts(fs []state.AttemptFailure) []StepAttempt {
	var out []StepAttempt
	for _, f := range fs {
		out = append(out, StepAttempt{Attempt: f.Attempt, StartedAt: f.StartedAt, EndedAt: f.EndedAt, Worker: f.Worker, Error: f.Error})
	}
	return out
}

// StepTaskKey is the task idempotency key of a committed step.
type StepTaskKey struct {
	// Key is the key as stored in the task keys bucket: the scope
	// (r.<run-id>, w.<workflow> or g), a hash of the caller's key, and the
	// step name, such as w.orders.6f1c...9a.send-email.
	Key string `json:"key"`
	// Served is true when the step did not run: its result was served
	// from the key's cache, as produced by step From.
	Served bool `json:"served"`
	// From is the step ID whose execution produced the result: another
	// run's step when Served, this step's own otherwise.
	From string `json:"from"`
}

// Steps lists a run's committed steps in the order the workflow called
// them: the run's history, as a tool reads it. For a run ID started again
// by the conflict policy, it is the current run's history. An event
// delivered for a wait the body has not reached yet is listed last, in
// the order the events came.
func (c *Client) Steps(ctx context.Context, runID string) (_ []StepRecord, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return nil, err
	}
	identity, ended := c.current(ctx, runID)
	h, err := c.history(ctx, runID, identity, ended)
	return h.steps, err
}

// OpenWaits lists what the current run of runID waits for and has not got
// yet — a sleep's end, an event, a hook's resume, a child run's end — in
// call order, each with when it began and until when it waits (zero when
// it has no deadline). A run that waits for nothing, or has ended, has
// none. Like Steps, it is a tool's read: two reads of the buckets.
func (c *Client) OpenWaits(ctx context.Context, runID string) (_ []OpenWait, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return nil, err
	}
	identity, ended := c.current(ctx, runID)
	h, err := c.history(ctx, runID, identity, ended)
	return h.waits, err
}

// RunDescription is everything a tool shows of a run, read at once by
// Describe: the run, its committed steps in call order, the steps that
// failed or started again and have not committed, and what it waits for.
// Its JSON encoding is the run's fields followed by "steps", "open_steps"
// and "waits" (lists that are empty, never null), as GET /v1/runs/{id}
// sends it and the producer's get --output json prints it.
type RunDescription struct {
	Run
	Steps     []StepRecord `json:"steps"`
	OpenSteps []OpenStep   `json:"open_steps"`
	Waits     []OpenWait   `json:"waits"`
}

// Describe reads runID's RunDescription: GetRun, Steps, OpenSteps and
// OpenWaits of the same generation, with one read of the run. It returns
// ErrRunNotFound for a run ID without a run.
func (c *Client) Describe(ctx context.Context, runID string) (_ RunDescription, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	run, err := c.GetRun(ctx, runID)
	if err != nil {
		return RunDescription{}, err
	}
	identity := state.RunIdentity(runID, run.Generation)
	h, err := c.history(ctx, runID, identity, run.Status.Terminal())
	if err != nil {
		return RunDescription{}, err
	}
	open, err := c.openSteps(ctx, runID, identity)
	if err != nil {
		return RunDescription{}, err
	}
	return RunDescription{Run: run, Steps: h.steps, OpenSteps: open, Waits: h.waits}, nil
}

// MarshalJSON encodes d with its lists empty, never null.
func (d RunDescription) MarshalJSON() ([]byte, error) {
	type plain RunDescription // without this method
	p := plain(d)
	if p.Steps == nil {
		p.Steps = []StepRecord{}
	}
	if p.OpenSteps == nil {
		p.OpenSteps = []OpenStep{}
	}
	if p.Waits == nil {
		p.Waits = []OpenWait{}
	}
	return json.Marshal(p)
}

// OpenWait is a wait a run has begun and that has not ended: its step has
// no committed record yet.
type OpenWait struct {
	StepID string `json:"step_id"`
	Name   string `json:"name"`
	// Kind is "sleep", "event", "hook" or "child".
	Kind string `json:"kind"`
	// Event is the event an event or hook wait waits for, HookToken a hook
	// wait's token, ChildRunID the run a child wait waits for.
	Event      string `json:"event,omitempty"`
	HookToken  string `json:"hook_token,omitempty"`
	ChildRunID string `json:"child_run_id,omitempty"`
	// Since is when the run began the wait; Until when it ends without an
	// event (a sleep's end, a wait's timeout), zero when it has no
	// deadline.
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitzero"`
}

// historyReads are the subjects of history's batch reads: a direct get on
// the steps and the attempts buckets' streams, without a key.
var historyReads = []string{
	"$JS.API.DIRECT.GET.KV_" + jetstream.StepsBucket,
	"$JS.API.DIRECT.GET.KV_" + jetstream.AttemptsBucket,
}

// history is what Steps and OpenWaits read.
type history struct {
	steps []StepRecord
	waits []OpenWait
}

// history reads the committed steps, the lease and the wait records of
// runID's generation whose records are keyed by identity (ended: the run
// has ended), a snapshot of each bucket, and orders them by call. A wait's
// record places the event its sender committed (which carries no place of
// its own) and gives a committed wait its start. A wait is open while its
// step has no record, the run has not ended and, when the run is parked,
// the park awaits it (the losers of an AwaitFirst are not).
func (c *Client) history(ctx context.Context, runID, identity string, ended bool) (history, error) {
	// A batch read the connection's user may not make gets no answer:
	// the server's refusal fails it at once (ErrPermissionDenied), not at
	// the end of ctx as if NATS were down.
	rctx, stop := c.denials.watch(ctx, c.nc, historyReads...)
	defer stop()
	failed := func(what string, err error) error {
		if cause := context.Cause(rctx); errors.Is(cause, ErrPermissionDenied) {
			err = cause
		}
		return fmt.Errorf("jetflow: read the %s of %s: %w", what, runID, err)
	}
	// Step IDs have three tokens, the run's lease two.
	entries, err := c.assets.Steps.Matching(rctx, identity+".>")
	if err != nil {
		return history{}, failed("steps", err)
	}
	marks, err := c.assets.Attempts.Matching(rctx, state.WaitKeys(identity))
	if err != nil {
		return history{}, failed("waits", err)
	}
	waits := make(map[string]state.Wait, len(marks))
	for _, e := range marks {
		w, err := state.DecodeWait(e.Value)
		if err != nil {
			return history{}, fmt.Errorf("jetflow: wait %s: %w", e.Key, err)
		}
		waits[w.StepID] = w
	}
	var h history
	placed := make(map[string]bool, len(entries)) // steps whose place in call order is known
	var lease *state.Lease
	for _, e := range entries {
		if e.Key == state.LeaseKey(identity) {
			l, err := state.DecodeLease(e.Value)
			if err != nil {
				return history{}, fmt.Errorf("jetflow: lease of %s: %w", runID, err)
			}
			lease = &l
			continue
		}
		s, err := state.DecodeKeyedStep(e.Value)
		if err != nil {
			return history{}, err
		}
		rec := toStepRecord(s)
		placed[rec.StepID] = s.EventID == "" // an event's sender does not know the wait's place
		if w, ok := waits[s.StepID]; ok {
			rec.Seq, placed[rec.StepID] = w.Seq, true
			if rec.StartedAt.IsZero() {
				// A wait recorded after its end (an event that came
				// first) began when it ended.
				rec.StartedAt = minTime(w.Since, rec.CommittedAt)
			}
			delete(waits, s.StepID)
		}
		h.steps = append(h.steps, rec)
	}
	slices.SortStableFunc(h.steps, func(a, b StepRecord) int {
		if pa, pb := placed[a.StepID], placed[b.StepID]; pa != pb {
			if pa {
				return -1
			}
			return 1
		}
		if a.Seq != b.Seq {
			return cmp.Compare(a.Seq, b.Seq)
		}
		return a.CommittedAt.Compare(b.CommittedAt)
	})
	for id, w := range waits { // the ones whose step has not committed
		if ended || lease != nil && lease.State == state.LeaseParked && !slices.Contains(lease.Waits, id) {
			continue
		}
		h.waits = append(h.waits, toOpenWait(w))
	}
	slices.SortFunc(h.waits, func(a, b OpenWait) int { return cmp.Compare(waitSeq(a, waits), waitSeq(b, waits)) })
	return h, nil
}

func waitSeq(w OpenWait, waits map[string]state.Wait) int { return waits[w.StepID].Seq }

func toOpenWait(w state.Wait) OpenWait {
	return OpenWait{StepID: w.StepID, Name: state.StepName(w.StepID), Kind: w.Kind, Event: w.Event, HookToken: w.Token,
		ChildRunID: w.Child, Since: w.Since, Until: w.Until}
}

func toStepRecord(s state.KeyedStep) StepRecord {
	rec := StepRecord{StepID: s.StepID, Name: s.Name, Seq: s.Seq, Attempt: s.Attempt, Output: s.Output, Worker: s.Worker, Build: s.Build, CommittedAt: s.Committed, Child: s.Child,
		Kind: s.Kind, WakeAt: s.WakeAt, EventID: s.EventID, HookToken: s.HookToken, StartedAt: s.StartedAt, Attempts: toAttempts(s.Failures)}
	if s.Error != nil {
		rec.Error, rec.Fatal, rec.Code = s.Error.Message, s.Error.Fatal, s.Error.Code
	}
	if k := s.TaskKey; k != nil {
		rec.TaskKey = &StepTaskKey{Key: k.Key, Served: k.Served, From: k.From}
	}
	return rec
}

// identity is the key prefix of the current generation of runID's
// records (the run ID itself when it has no record).
func (c *Client) identity(ctx context.Context, runID string) string {
	identity, _ := c.current(ctx, runID)
	return identity
}

// current is identity, and whether that generation has ended.
func (c *Client) current(ctx context.Context, runID string) (identity string, ended bool) {
	if r, _, err := c.runs.Get(ctx, runID); err == nil {
		return state.RunIdentity(runID, r.Generation), r.Status.Terminal()
	}
	return runID, false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
