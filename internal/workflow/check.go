package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/jetflow/jetflow/internal/state"
)

// A replay check runs a workflow body in the process, without NATS,
// against a run's history as the engine would replay it, and records the
// steps the body starts. A step of the history is looked up by its step
// ID, as replay does; a step the history does not hold returns JSON null
// (its result type's zero value) so that the body goes on and the rest of
// its step sequence is known. Nothing is executed: no step function is
// called, no child started, no timer stored. The comparison of what the
// body started with the history is the caller's (package jetflowtest).

// Kinds of started steps (CheckStart.Kind, CheckKind).
const (
	CheckKindStep  = "step"
	CheckKindChild = "child"
	// A wait's kind is its WaitSpec.Kind: state.StepSleep,
	// state.StepEvent, state.StepHook.
)

// CheckRun is the history a check replays.
type CheckRun struct {
	Workflow   string
	RunID      string
	Generation int
	Input      json.RawMessage
	// Steps are the run's committed steps, in commit order: AwaitFirst
	// picks the first of them, as the engine picks the lowest revision.
	Steps []state.Step
}

// CheckStart is one step a body started during a check.
type CheckStart struct {
	Seq    int
	StepID string
	Name   string
	// Kind is CheckKindStep, CheckKindChild or a wait's kind.
	Kind string
	// Epoch counts the awaits the body had passed when it started the
	// step: steps of one epoch are in flight together, in no order.
	Epoch int
	// Child is a child step's child run ID.
	Child string
	// Known: the history holds a record under StepID.
	Known bool
}

// CheckResult is how a checked body ended and the steps it started.
type CheckResult struct {
	Started []CheckStart
	// Returned: the body returned Output and Err.
	Returned bool
	Output   json.RawMessage
	Err      error
	// Panicked: the body panicked, with Err saying what.
	Panicked bool
	// Misused are the body's calls that were refused: a wait for an
	// undeclared event, a call from another goroutine, steps never
	// awaited.
	Misused []error
	// Bounded: the body started more than the check's limit of steps and
	// was stopped; TimedOut: it did not return or start a step within the
	// timeout (its context was cancelled, the goroutine left running
	// until it returns).
	Bounded  bool
	TimedOut bool
}

// errCheckBound is the settlement a checked body is stopped with once it
// started more steps than its limit.
var errCheckBound = errors.New("jetflow: replay check: step limit reached")

// checker is the history a Context replays against in a check (Context.check).
type checker struct {
	steps   map[string]*state.Step
	limit   int
	started []CheckStart
	// misused are the body's calls that were refused (Context.Misuse),
	// from any of its goroutines.
	mu      sync.Mutex
	misused []error
}

// Check replays def's body against run's history and returns the steps it
// started and how it ended. It stops the body after limit steps, and gives
// up on a body that has not returned after timeout (cancelling the body's
// context). Check calls no step function and touches no NATS; repeat calls
// return the same for a deterministic body.
func Check(def Definition, run CheckRun, limit int, timeout time.Duration) CheckResult {
	ck := &checker{steps: make(map[string]*state.Step, len(run.Steps)), limit: limit}
	for i := range run.Steps {
		rec := run.Steps[i]
		rec.Rev = uint64(i + 1)
		ck.steps[rec.StepID] = &rec
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := &delivery{ctx: ctx, nctx: ctx, run: state.Run{RunID: run.RunID, Workflow: run.Workflow, Generation: run.Generation, Input: run.Input, Status: state.StatusRunning}}
	c := (&Executor{}).newContext(d, modeCheck, nil)
	c.check = ck
	c.spawn(def)
	var res CheckResult
	select {
	case s := <-c.done:
		switch {
		case s.panic:
			res.Panicked, res.Err = true, s.err
		case errors.Is(s.err, errCheckBound):
			res.Bounded = true
		default:
			res.Returned, res.Output, res.Err = true, s.output, s.err
		}
	case <-ctx.Done():
		res.TimedOut = true
	}
	// A body that timed out may still run and start steps: its list is
	// not read.
	if !res.TimedOut {
		res.Started = ck.started
	}
	ck.mu.Lock()
	res.Misused = append([]error(nil), ck.misused...)
	ck.mu.Unlock()
	return res
}

// begin records p and gives it its history record, or a JSON null result
// when the history has none, so that awaits return at once. A body past
// its limit is stopped.
func (ck *checker) begin(c *Context, p *Pending) {
	if len(ck.started) >= ck.limit {
		c.park(&settlement{kind: settleDrop, err: errCheckBound})
	}
	st := CheckStart{Seq: p.seq, StepID: p.id, Name: p.name, Kind: CheckKindStep, Epoch: p.epoch}
	switch {
	case p.call.child != nil:
		st.Kind, st.Child = CheckKindChild, p.call.child.RunID
	case p.call.wait != nil:
		st.Kind = p.call.wait.Kind
	}
	rec, ok := ck.steps[p.id]
	st.Known = ok
	ck.started = append(ck.started, st)
	if !ok {
		rec = &state.Step{StepID: p.id, RunID: c.run.RunID, Name: p.name, Seq: p.seq, Output: json.RawMessage("null"), Rev: math.MaxUint64}
	}
	p.rec = rec
}

// CheckKind is the kind of step rec stands for, in CheckStart.Kind's terms.
func CheckKind(rec state.Step) string {
	switch {
	case rec.Child != "":
		return CheckKindChild
	case rec.Kind != "":
		return rec.Kind
	}
	return CheckKindStep
}
