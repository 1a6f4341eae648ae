package workflow

import (
	"context"
	"encoding/json"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
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
// workflow body calls Step through it; everything else about the run is
// read-only.
type Context struct {
	// ctx is cancelled when the worker gives up on in-flight steps; steps
	// run with it. nctx is never cancelled (NATS operations get the
	// JetStream default timeout), so a finished step is still committed and
	// acknowledged during a drain.
	ctx  context.Context
	nctx context.Context
	exec *Executor
	task state.Task
	run  state.Run
	rev  uint64 // of run; 0 when unknown
	// delivered is the task message's delivery count.
	delivered int
	occ       map[string]int
	seq       int
	executed  bool
	// suspended is set once the body is being unwound: deferred Step calls
	// then unwind too, without touching NATS or settling again.
	suspended bool
	done      chan *settlement
}

// taskSubject is the subject of the task being handled.
func (c *Context) taskSubject() string {
	if c.task.StepID != "" {
		return jetstream.TaskSubject(c.run.Workflow, c.run.RunID, c.task.StepID)
	}
	return jetstream.TaskSubject(c.run.Workflow, state.RunIdentity(c.run.RunID, c.run.Generation), "")
}

// runKey identifies this run in the history cache: the run ID and the token
// of the start that created it, so that a run ID reused after its retention
// never sees the earlier run's steps.
func (c *Context) runKey() string { return c.run.RunID + "/" + c.run.Token }

// Context is the worker's context: cancelled when the worker stops.
func (c *Context) Context() context.Context { return c.ctx }

// RunID is the ID of the run being executed.
func (c *Context) RunID() string { return c.run.RunID }

// Workflow is the workflow name.
func (c *Context) Workflow() string { return c.run.Workflow }
