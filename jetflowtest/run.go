package jetflowtest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jetflow/jetflow"
)

// Run starts wf with input through the Env's client and waits for its
// result within the Env's Timeout. It returns the run's output, or the
// run's error (a *jetflow.RunError) when it failed or was cancelled, or
// the wait's error (context.DeadlineExceeded when the Timeout passed). A
// start that could not be made fails the test at once.
//
// A repeat call with the same run ID (jetflow.WithRunID) lands on the same
// run, as any start does: it returns that run's result.
func Run[P, R any](e *Env, wf *jetflow.Workflow[P, R], input P, opts ...jetflow.StartOption) (R, error) {
	e.t.Helper()
	h := Start(e, wf, input, opts...)
	ctx, cancel := e.context()
	defer cancel()
	return h.Result(ctx)
}

// Start starts wf with input through the Env's client and returns the
// run's handle without waiting. A start that could not be made fails the
// test at once.
func Start[P, R any](e *Env, wf *jetflow.Workflow[P, R], input P, opts ...jetflow.StartOption) *jetflow.Handle[R] {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	h, err := jetflow.Start(ctx, e.client, wf, input, opts...)
	if err != nil {
		e.t.Fatalf("jetflowtest: start %s: %v", wf.Name(), err)
	}
	return h
}

// Wait waits, within the Env's Timeout, for run runID to end and returns
// it as stored. A wait that could not be made fails the test at once.
func (e *Env) Wait(runID string) jetflow.Run {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	run, err := e.client.WaitRun(ctx, runID)
	if err != nil {
		e.t.Fatalf("jetflowtest: wait for run %s: %v", runID, err)
	}
	return run
}

// Report is everything stored about one run: the run (status, input,
// output, error, generation and duplicate-start audit), its committed
// steps in the order the body started them (IDs, names, attempts with the
// failed ones before, results, task keys, sleeps, timers and events), and
// the steps that failed and have not committed, and what the run waits
// for (a sleep, an event, a hook, a child run: since when, until when).
type Report struct {
	Run   jetflow.Run
	Steps []jetflow.StepRecord
	Open  []jetflow.OpenStep
	Waits []jetflow.OpenWait
}

// Inspect reads run runID's Report. A read that could not be made fails
// the test at once.
func (e *Env) Inspect(runID string) Report {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	d, err := e.client.Describe(ctx, runID)
	if err != nil {
		e.t.Fatalf("jetflowtest: read run %s: %v", runID, err)
	}
	r := Report{Run: d.Run, Steps: d.Steps, Open: d.OpenSteps, Waits: d.Waits}
	return r
}

// Step is the committed step called name (its first call) in the Report,
// or false.
func (r Report) Step(name string) (jetflow.StepRecord, bool) {
	for _, s := range r.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return jetflow.StepRecord{}, false
}

// StepNames are the names of the committed steps, in order.
func (r Report) StepNames() []string {
	names := make([]string, len(r.Steps))
	for i, s := range r.Steps {
		names[i] = s.Name
	}
	return names
}

// Output decodes the step record's committed result into a T.
func Output[T any](s jetflow.StepRecord) (T, error) {
	var v T
	if err := json.Unmarshal(s.Output, &v); err != nil {
		return v, fmt.Errorf("jetflowtest: decode output of step %s: %w", s.StepID, err)
	}
	return v, nil
}

// Background is a context bounded by the Env's Timeout, for the client's
// own calls; cancel it when done.
func (e *Env) Background() (context.Context, context.CancelFunc) { return e.context() }

// SendEvent sends the event called name, with ID eventID and payload
// encoded to JSON, to run runID, and returns what Client.SendEvent does: a
// wait for it that is open or opens later receives it, a repeat with the
// same eventID is a duplicate that changes nothing (its result says so),
// and a run that has ended answers jetflow.ErrRunEnded. A payload that
// cannot be encoded fails the test at once.
func (e *Env) SendEvent(runID, name, eventID string, payload any) (jetflow.EventResult, error) {
	e.t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		e.t.Fatalf("jetflowtest: encode the payload of event %s: %v", name, err)
	}
	ctx, cancel := e.context()
	defer cancel()
	return e.client.SendEvent(ctx, runID, name, eventID, b)
}
