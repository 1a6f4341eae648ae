package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
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
	// Worker names the worker whose attempt was committed. For a result
	// served from a task key it goes on with " (served from task key
	// <key>, result of <step ID>)"; read TaskKey rather than this text.
	Worker      string    `json:"worker,omitempty"`
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
	// event, empty for a step that ran a function or a child.
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
// by the conflict policy, it is the current run's history.
func (c *Client) Steps(ctx context.Context, runID string) (_ []StepRecord, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return nil, err
	}
	identity := c.identity(ctx, runID)
	// Step IDs have three tokens; the run's lease (two) is not a step.
	lister, err := c.assets.Steps.Raw().ListKeysFiltered(ctx, identity+".*.*")
	if err != nil {
		return nil, fmt.Errorf("jetflow: list steps of %s: %w", runID, err)
	}
	var out []StepRecord
	for key := range lister.Keys() {
		v, _, err := c.assets.Steps.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		s, err := state.DecodeKeyedStep(v)
		if err != nil {
			return nil, err
		}
		rec := StepRecord{StepID: s.StepID, Name: s.Name, Seq: s.Seq, Attempt: s.Attempt, Output: s.Output, Worker: s.Worker, CommittedAt: s.Committed, Child: s.Child,
			Kind: s.Kind, WakeAt: s.WakeAt, EventID: s.EventID, HookToken: s.HookToken, StartedAt: s.StartedAt, Attempts: toAttempts(s.Failures)}
		if s.Error != nil {
			rec.Error, rec.Fatal = s.Error.Message, s.Error.Fatal
		}
		if k := s.TaskKey; k != nil {
			rec.TaskKey = &StepTaskKey{Key: k.Key, Served: k.Served, From: k.From}
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// identity is the key prefix of the current generation of runID's
// records (the run ID itself when it has no record).
func (c *Client) identity(ctx context.Context, runID string) string {
	if r, _, err := c.runs.Get(ctx, runID); err == nil {
		return state.RunIdentity(runID, r.Generation)
	}
	return runID
}
