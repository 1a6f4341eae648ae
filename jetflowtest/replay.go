package jetflowtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
	"github.com/jetflow/jetflow/jetflowtype"
)

// DivergenceKind says how changed workflow code departs from a run's
// history (the engine's own kinds: a worker whose code diverges from a
// run's history blocks the run with the same report).
type DivergenceKind = jetflowtype.DivergenceKind

// The kinds of divergence Replay reports; jetflowtype documents each.
const (
	Renamed      = jetflowtype.DivergenceRenamed
	Removed      = jetflowtype.DivergenceRemoved
	Reordered    = jetflowtype.DivergenceReordered
	Inserted     = jetflowtype.DivergenceInserted
	KindChanged  = jetflowtype.DivergenceKindChanged
	ChildChanged = jetflowtype.DivergenceChildChanged
	InputChanged = jetflowtype.DivergenceInputChanged
	Panicked     = jetflowtype.DivergencePanicked
	TimedOut     = jetflowtype.DivergenceTimedOut
	Unbounded    = jetflowtype.DivergenceUnbounded
)

// ReplayStep is a step as the replay check compares it: step ID, name and
// kind ("step", "child", "sleep", "event" or "hook").
type ReplayStep = jetflowtype.DivergedStep

// ErrMisuse: the body makes calls the engine refuses whatever the history:
// a wait for an event the workflow does not declare (WithEvent), a step
// started from a goroutine of its own, steps started and never awaited
// before it returns. Replay and New report it, joined with each refusal.
var ErrMisuse = errors.New("jetflowtest: the workflow body misuses jetflow")

// misuse is ErrMisuse with the refusals of res, or nil.
func misuse(name string, res workflow.CheckResult) error {
	if len(res.Misused) == 0 {
		return nil
	}
	return fmt.Errorf("%w: workflow %s: %w", ErrMisuse, name, errors.Join(res.Misused...))
}

// DryRun replays wf's body as a run that has committed nothing (its input
// JSON null, every step's result its type's zero value), running no step,
// and returns ErrMisuse when the body makes a call the engine refuses on
// the way: the mistakes a run would meet only when it reaches them. New
// runs it for every workflow it serves.
func DryRun(wf jetflow.Registrable) error {
	run := workflow.CheckRun{Workflow: wf.Name(), RunID: "dry-run", Input: json.RawMessage("null")}
	return misuse(wf.Name(), workflow.Check(wf.Definition(), run, 10_000, 10*time.Second))
}

// DivergenceError is Replay's report of changed code that would not
// replay a run's history: where (Position, the step's place in the
// history, counted from 0 in the order the body starts steps; for a
// Ranked history, not counting the waits an event ended), what the
// history has there and what the changed code does.
type DivergenceError struct {
	Workflow string
	RunID    string
	Kind     DivergenceKind
	Position int
	// History is the history's step at Position (nil: none, or the
	// divergence is the body's own failure); Code is the step the changed
	// code starts there (nil: it starts none).
	History *ReplayStep
	Code    *ReplayStep
	// Detail says more, in words.
	Detail string
}

func (e *DivergenceError) Error() string {
	return fmt.Sprintf("jetflowtest: run %s of %s diverges at step %d (%s): history has %s, the code starts %s: %s",
		e.RunID, e.Workflow, e.Position, e.Kind, e.History, e.Code, e.Detail)
}

// ReplayOption configures Replay.
type ReplayOption func(*replayOptions)

type replayOptions struct {
	timeout time.Duration
}

// WithReplayTimeout bounds how long Replay waits for the body (default
// 10s; d <= 0 keeps it). A body still running then is reported as
// TimedOut, its context cancelled.
func WithReplayTimeout(d time.Duration) ReplayOption {
	return func(o *replayOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// Replay checks that wf's code, as it is now, replays h: that a run
// whose history is h, taken over by a worker running this code, goes on
// without running a committed step again or skipping, reordering or
// retyping one. It runs the body in this process against h without NATS,
// calling no step function, and compares the steps it starts with h's in
// order, by step ID (name and occurrence) and kind. Steps the code starts
// after the end of h are new work and allowed. A sleep's duration, a
// step's options and its function are not compared: a committed step is
// never run again, whatever its function now does.
//
// It returns nil when the code replays h, a *DivergenceError at the first
// place where it does not (see DivergenceKind), or ErrInvalidHistory when h
// is not wf's or cannot be replayed.
func Replay(wf jetflow.Registrable, h History, opts ...ReplayOption) error {
	o := replayOptions{timeout: 10 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if err := h.validate(); err != nil {
		return err
	}
	if wf.Name() != h.Workflow {
		return fmt.Errorf("%w: a run of %s checked against workflow %s", ErrInvalidHistory, h.Workflow, wf.Name())
	}
	run := workflow.CheckRun{Workflow: h.Workflow, RunID: h.RunID, Generation: h.Generation, Input: h.Input}
	maxSeq := -1
	for _, s := range h.commitOrder() {
		run.Steps = append(run.Steps, s.record(h.RunID))
		maxSeq = max(maxSeq, s.Seq)
	}
	// Room for every step of the history after as many inserted ones.
	limit := maxSeq + 1 + 2*len(h.Steps) + 16
	res := workflow.Check(wf.Definition(), run, limit, o.timeout)
	if err := compare(h, res); err != nil {
		return err
	}
	return misuse(wf.Name(), res)
}

// commitOrder is h's steps in the order they were committed.
func (h History) commitOrder() []HistoryStep {
	steps := append([]HistoryStep(nil), h.Steps...)
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].CommittedAt.Before(steps[j].CommittedAt) })
	return steps
}

// record is s as the engine's committed record.
func (s HistoryStep) record(runID string) state.Step {
	rec := state.Step{StepID: s.StepID, RunID: runID, Name: s.Name, Seq: s.Seq, Attempt: 1, Output: s.Output,
		Child: s.Child, Kind: s.Kind, EventID: s.EventID, Committed: s.CommittedAt}
	if s.Error != "" {
		rec.Error = &state.ErrorInfo{Message: s.Error, Fatal: s.Fatal, Code: s.Code, Kind: "step"}
	}
	return rec
}

// compare returns the first divergence of res from h (workflow.Compare),
// or nil.
func compare(h History, res workflow.CheckResult) error {
	steps := make([]workflow.HistoryStep, len(h.Steps))
	for i, s := range h.Steps {
		steps[i] = workflow.HistoryStep{Seq: s.Seq, StepID: s.StepID, Name: s.Name,
			Kind: workflow.CheckKind(state.Step{Kind: s.Kind, Child: s.Child}), Child: s.Child}
	}
	d := workflow.Compare(steps, h.Ranked, res)
	if d == nil {
		return nil
	}
	return &DivergenceError{Workflow: h.Workflow, RunID: h.RunID, Kind: d.Kind, Position: d.Position,
		History: d.History, Code: d.Code, Detail: d.Detail}
}
