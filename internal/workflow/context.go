package workflow

import (
	"context"
	"encoding/json"
)

// StepInfo describes the step attempt that is running.
type StepInfo struct {
	// StepID is deterministic: run ID, step name and occurrence. Pass it as
	// the Idempotency-Key of external calls.
	StepID   string
	StepName string
	// Attempt counts from 1; a redelivery after a crash is a new attempt.
	Attempt  int
	RunID    string
	Workflow string
}

type stepInfoKey struct{}

// InfoFrom returns the StepInfo of the step running with ctx.
func InfoFrom(ctx context.Context) (StepInfo, bool) {
	info, ok := ctx.Value(stepInfoKey{}).(StepInfo)
	return info, ok
}

// StepFunc is a type-erased step body: it returns the step's JSON result.
type StepFunc func(ctx context.Context) (json.RawMessage, error)

// Context is the replay state of one run while one task is handled. The
// workflow body calls StepWithKey through it; everything else about the run
// is read-only.
type Context struct {
	*delivery
	// exec looks committed steps up and executes the step this task owns;
	// it is handed the delivery and the call, never the Context.
	exec *Executor
	occ  map[string]int
	seq  int
	// epoch counts the awaits the body has passed (see Pending).
	epoch int
	// started are the steps the body started, in order.
	started []*Pending
	// executed is set once this task has executed its own step, in epoch
	// ownEpoch.
	executed bool
	ownEpoch int
	// mine is that step; settledEpoch the epoch opened by the await that
	// returned it (-1 before).
	mine         *Pending
	settledEpoch int
	// own is the start task's own step, to run at the first await
	// (runOwn).
	own *Pending
	// parked is set once the body is being unwound (park): deferred Step
	// calls then unwind too, without touching NATS or settling again.
	parked bool
	done   chan *settlement
	// check is set in a replay check (check.go): steps are looked up in
	// its history only, and nothing is executed.
	check *checker
}

// Context is the worker's context: cancelled when the worker stops.
func (c *Context) Context() context.Context { return c.ctx }

// RunID is the ID of the run being executed.
func (c *Context) RunID() string { return c.run.RunID }

// Workflow is the workflow name.
func (c *Context) Workflow() string { return c.run.Workflow }
