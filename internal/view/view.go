// Package view holds the JSON shapes of runs, steps and starts that jetflow
// shows outside the process: the HTTP API's bodies and the CLI's
// --output json. Field names are snake_case and stable: a field is only
// ever added, never renamed or removed.
package view

import (
	"encoding/json"
	"time"

	"github.com/jetflow/jetflow"
)

// Run is a run as stored, with its duplicate audit and, where the caller
// asked for them, its committed steps.
type Run struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	// Status is running, completed, failed or cancelled.
	Status    string    `json:"status"`
	Source    string    `json:"source,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Generation counts the runs started again under this run ID by the
	// conflict policy (0 for the first).
	Generation int `json:"generation"`
	// Duplicates is how many duplicate starts the run ID has seen;
	// FirstDuplicate and RecentDuplicates (oldest first) describe them.
	Duplicates       int64       `json:"duplicates"`
	FirstDuplicate   *Duplicate  `json:"first_duplicate,omitempty"`
	RecentDuplicates []Duplicate `json:"recent_duplicates,omitempty"`
	// Input, Output and Error are the run's JSON input, its output once
	// completed, and why it did not complete.
	Input  json.RawMessage `json:"input,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  *RunError       `json:"error,omitempty"`
	// Steps is present (possibly empty) when the view was made with the
	// run's steps (NewRunWithSteps), absent otherwise.
	Steps []Step `json:"steps,omitzero"`
}

// RunError is why a run did not complete.
type RunError struct {
	// Kind is "workflow", "step", "input", "panic" or "cancelled".
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Duplicate is one duplicate start from a run's audit.
type Duplicate struct {
	At     time.Time `json:"at"`
	Source string    `json:"source,omitempty"`
	// Outcome is existing, conflict, rejected or restarted.
	Outcome          string `json:"outcome"`
	FingerprintMatch bool   `json:"fingerprint_match"`
	// Status is the run's state the attempt saw.
	Status string `json:"status,omitempty"`
}

// Step is one committed step of a run.
type Step struct {
	StepID      string          `json:"step_id"`
	Name        string          `json:"name"`
	Attempt     int             `json:"attempt"`
	Output      json.RawMessage `json:"output,omitempty"`
	Error       string          `json:"error,omitempty"`
	Fatal       bool            `json:"fatal,omitempty"`
	Worker      string          `json:"worker,omitempty"`
	CommittedAt time.Time       `json:"committed_at"`
}

// StartResult is what a start did: which run, and its outcome (created,
// existing or restarted).
type StartResult struct {
	RunID      string `json:"run_id"`
	Workflow   string `json:"workflow"`
	Outcome    string `json:"outcome"`
	Status     string `json:"status"`
	Duplicates int64  `json:"duplicates"`
	// AfterExpiry is set on a created run whose run ID had been used by a
	// run that has since been forgotten (its retention passed).
	AfterExpiry bool `json:"after_expiry,omitempty"`
}

// RunPage is one page of a run listing.
type RunPage struct {
	Runs []Run `json:"runs"`
	// NextCursor is the cursor of the next page; absent on the last one.
	NextCursor string `json:"next_cursor,omitempty"`
}

// NewRun returns the view of run, without steps.
func NewRun(run jetflow.Run) Run {
	v := Run{
		RunID: run.RunID, Workflow: run.Workflow, Status: string(run.Status), Source: run.Source,
		CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt, Generation: run.Generation,
		Duplicates: run.Duplicates, Input: run.Input, Output: run.Output,
	}
	if run.FirstDuplicate != nil {
		d := newDuplicate(*run.FirstDuplicate)
		v.FirstDuplicate = &d
	}
	for _, d := range run.RecentDuplicates {
		v.RecentDuplicates = append(v.RecentDuplicates, newDuplicate(d))
	}
	if run.Error != nil {
		v.Error = &RunError{Kind: run.Error.Kind, Message: run.Error.Message}
	}
	return v
}

// NewRunWithSteps returns the view of run with its committed steps; Steps
// is an empty list, never absent, when none has committed.
func NewRunWithSteps(run jetflow.Run, steps []jetflow.StepRecord) Run {
	v := NewRun(run)
	v.Steps = make([]Step, 0, len(steps))
	for _, s := range steps {
		v.Steps = append(v.Steps, NewStep(s))
	}
	return v
}

// NewStep returns the view of a committed step.
func NewStep(s jetflow.StepRecord) Step {
	return Step{
		StepID: s.StepID, Name: s.Name, Attempt: s.Attempt, Output: s.Output,
		Error: s.Error, Fatal: s.Fatal, Worker: s.Worker, CommittedAt: s.CommittedAt,
	}
}

// NewStartResult returns the view of a start's result.
func NewStartResult(res jetflow.StartResult) StartResult {
	return StartResult{
		RunID: res.RunID, Workflow: res.Workflow, Outcome: string(res.Outcome),
		Status: string(res.Status), Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry,
	}
}

// NewRunPage returns the view of a page of runs; Runs is an empty list,
// never null, on an empty page.
func NewRunPage(page jetflow.RunPage) RunPage {
	v := RunPage{Runs: make([]Run, 0, len(page.Runs)), NextCursor: page.Next}
	for _, r := range page.Runs {
		v.Runs = append(v.Runs, NewRun(r))
	}
	return v
}

func newDuplicate(d jetflow.DuplicateAttempt) Duplicate {
	return Duplicate{At: d.At, Source: d.Source, Outcome: d.Outcome, FingerprintMatch: d.FingerprintMatch, Status: string(d.Status)}
}
