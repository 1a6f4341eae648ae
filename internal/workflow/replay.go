package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// replay runs the workflow body in its own goroutine against the run's
// committed steps, until the body returns (a finish settlement) or parks at
// a step it cannot go past in this task (see Context.park), and returns how
// to settle the task.
func (e *Executor) replay(d *delivery, def Definition) *settlement {
	c := &Context{delivery: d, exec: e, occ: make(map[string]int), ownEpoch: -1, settledEpoch: -1, done: make(chan *settlement, 1)}
	c.spawn(def)
	return <-c.done
}

// spawn runs def's body on a goroutine of its own, which sends how it
// ended on c.done: its return, its panic, or the settlement it parked on.
func (c *Context) spawn(def Definition) {
	go func() {
		defer func() {
			if r := recover(); r != nil {
				c.done <- &settlement{kind: settleFinish, panic: true,
					err: fmt.Errorf("workflow panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := def.Run(c, c.run.Input)
		c.done <- &settlement{kind: settleFinish, output: out, err: err}
	}()
}

// lookup returns the committed record of stepID, from the cache or the
// steps bucket; nil when the step has no committed record.
func (e *Executor) lookup(ctx context.Context, runKey, stepID string) (*state.Step, error) {
	if s, ok := e.cache.get(runKey, stepID); ok {
		return s, nil
	}
	v, rev, err := e.cfg.Assets.Steps.Get(ctx, stepID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s, err := state.DecodeStep(v)
	if err != nil {
		return nil, err
	}
	s.Rev = rev
	e.cache.put(runKey, &s)
	return &s, nil
}

// StepWithKey returns the committed result of the next call of the step
// called name, running fn to produce it only if this task is the one that
// owns the step and it is not committed yet: Start and Await of one step.
// A non-zero key makes the call go through a task idempotency key (see
// TaskKey). When the step belongs to another task, or must be retried
// later, StepWithKey does not return: the workflow body is unwound
// (deferred calls run) and the task is settled.
//
// A step whose final failure is committed returns a *StepError, on every
// replay. Invalid arguments (name, policy, key) are returned as errors.
func (c *Context) StepWithKey(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (json.RawMessage, error) {
	p, err := c.Start(name, policy, key, fn)
	if err != nil {
		return nil, err
	}
	return c.Result(p)
}

// stepResult turns a committed record into what a step call returns.
func stepResult(rec *state.Step) (json.RawMessage, error) {
	if rec.Error != nil {
		return nil, &StepError{
			RunID: rec.RunID, StepID: rec.StepID, StepName: rec.Name,
			Attempts: rec.Attempt, Fatal: rec.Error.Fatal, Code: rec.Error.Code, Message: rec.Error.Message,
			ChildRunID: rec.Child, ChildStatus: childStatus(rec.Error.Kind),
		}
	}
	return rec.Output, nil
}

// childStatus is how the child of a child step whose failure has kind
// ended; empty for a step's own failure and a child that was not started.
func childStatus(kind string) state.Status {
	switch kind {
	case KindChildFailed:
		return state.StatusFailed
	case KindChildCancelled:
		return state.StatusCancelled
	}
	return ""
}

// park hands s to the executor (unless the body is already parked; s may
// then be nil) and unwinds the workflow goroutine: the body's deferred calls
// run and the goroutine ends.
//
// park never returns: it unwinds the workflow goroutine with runtime.Goexit.
// It is the one place where the body is left without a return, because a
// call that cannot produce its step's result must not return to user code;
// it is called from Start and Await only.
func (c *Context) park(s *settlement) {
	if !c.parked {
		c.parked = true
		c.done <- s
	}
	runtime.Goexit()
}
