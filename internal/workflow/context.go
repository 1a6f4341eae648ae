package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"time"

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

// Step returns the committed result of the next call of the step called
// name, running fn to produce it only if this task is the one that owns the
// step and it is not committed yet. When the step belongs to another task,
// or must be retried later, Step does not return: the workflow body is
// unwound (deferred calls run) and the task is settled.
//
// A step whose final failure is committed returns a *StepError, on every
// replay.
func (c *Context) Step(name string, policy RetryPolicy, fn StepFunc) (json.RawMessage, error) {
	return c.step(name, policy, TaskKey{}, fn)
}

func (c *Context) step(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (json.RawMessage, error) {
	if c.suspended {
		runtime.Goexit()
	}
	if err := state.ValidateName(name); err != nil {
		return nil, err
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	occ := c.occ[name]
	c.occ[name] = occ + 1
	seq := c.seq
	c.seq++
	id := state.StepID(state.RunIdentity(c.run.RunID, c.run.Generation), name, occ)

	if c.executed {
		// This task ran its step; the next uncommitted one belongs to its
		// own task. Publishing that task is safe even if the step was
		// committed meanwhile (its task then only replays), so skip the read
		// unless the history is at hand.
		if rec, ok := c.exec.cache.get(c.runKey(), id); ok {
			return stepResult(rec)
		}
		c.suspend(&settlement{kind: settleDispatch, stepID: id})
	}
	rec, ok, err := c.exec.lookup(c.nctx, c.runKey(), id)
	if err != nil {
		c.suspend(&settlement{kind: settleRelease, err: err})
	}
	if !ok {
		mine := c.task.StepID == id || (c.task.StepID == "" && seq == 0)
		if !mine {
			c.suspend(&settlement{kind: settleDispatch, stepID: id})
		}
		c.executed = true
		rec = c.exec.execute(c, name, id, seq, policy.WithDefaults(), fn, c.keyCall(key, name, id))
	}
	return stepResult(rec)
}

// stepResult turns a committed record into what Step returns.
func stepResult(rec state.Step) (json.RawMessage, error) {
	if rec.Error != nil {
		return nil, &StepError{
			RunID: rec.RunID, StepID: rec.StepID, StepName: rec.Name,
			Attempts: rec.Attempt, Fatal: rec.Error.Fatal, Code: rec.Error.Code, Message: rec.Error.Message,
		}
	}
	return rec.Output, nil
}

// suspend hands the settlement to the executor and unwinds the workflow
// goroutine. It never returns.
func (c *Context) suspend(s *settlement) {
	if !c.suspended {
		c.suspended = true
		c.done <- s
	}
	runtime.Goexit()
}

type settleKind int

const (
	// settleDispatch: publish the task of stepID, then ack.
	settleDispatch settleKind = iota + 1
	// settleRetry: nak with delay; the step runs again on redelivery.
	settleRetry
	// settleFinish: the workflow returned; record the run's end, then ack.
	settleFinish
	// settleRelease: leave the task to another attempt soon (shutdown,
	// infrastructure error). Nothing was committed by this attempt.
	settleRelease
	// settleDrop: the task is not the one to run its step (errNotThisTask):
	// acknowledge it, doing nothing.
	settleDrop
)

// errNotThisTask: a task that must not run its step: a redispatched task
// while a retry timer of the step is waiting, or a retry whose attempt
// already ran.
var errNotThisTask = errors.New("jetflow: not this task's step to run")

type settlement struct {
	kind   settleKind
	stepID string
	delay  time.Duration
	// attempt is the attempt that failed (retry).
	attempt int
	output  json.RawMessage
	err     error // workflow error (finish) or cause (release, retry)
	panic   bool
}
