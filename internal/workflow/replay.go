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
	c := &Context{delivery: d, exec: e, occ: make(map[string]int), done: make(chan *settlement, 1)}
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
	return <-c.done
}

// lookup returns the committed record of stepID, from the cache or the
// steps bucket; nil when the step has no committed record.
func (e *Executor) lookup(ctx context.Context, runKey, stepID string) (*state.Step, error) {
	if s, ok := e.cache.get(runKey, stepID); ok {
		return &s, nil
	}
	v, _, err := e.cfg.Assets.Steps.Get(ctx, stepID)
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
	e.cache.put(runKey, s)
	return &s, nil
}

// StepWithKey returns the committed result of the next call of the step
// called name, running fn to produce it only if this task is the one that
// owns the step and it is not committed yet. A non-zero key makes the call
// go through a task idempotency key (see TaskKey). When the step belongs to
// another task, or must be retried later, StepWithKey does not return: the
// workflow body is unwound (deferred calls run) and the task is settled.
//
// A step whose final failure is committed returns a *StepError, on every
// replay. Invalid arguments (name, policy, key) are returned as errors.
func (c *Context) StepWithKey(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (json.RawMessage, error) {
	if c.parked {
		// A Step the body deferred, running while the body unwinds: unwind
		// on, without touching NATS or settling again.
		c.park(nil)
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
	rec, s := c.resolve(name, policy, key, fn)
	if s != nil {
		c.park(s)
	}
	return stepResult(rec)
}

// resolve returns the committed record of the next call of step name,
// executing the step when this task owns it, or, when the body cannot go
// past this call in this task, the settlement of the task.
func (c *Context) resolve(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (*state.Step, *settlement) {
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
			return &rec, nil
		}
		return nil, &settlement{kind: settleDispatch, stepIDs: []string{id}, ranStep: true}
	}
	rec, err := c.exec.lookup(c.nctx, c.runKey(), id)
	if err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	if rec != nil {
		return rec, nil
	}
	if mine := c.task.StepID == id || (c.task.StepID == "" && seq == 0); !mine {
		// The frontier: the step belongs to a task of its own.
		return nil, &settlement{kind: settleDispatch, stepIDs: []string{id}}
	}
	c.executed = true
	return c.exec.execute(c.delivery, &stepCall{name: name, id: id, seq: seq, policy: policy.WithDefaults(), taskKey: key, fn: fn})
}

// stepResult turns a committed record into what StepWithKey returns.
func stepResult(rec *state.Step) (json.RawMessage, error) {
	if rec.Error != nil {
		return nil, &StepError{
			RunID: rec.RunID, StepID: rec.StepID, StepName: rec.Name,
			Attempts: rec.Attempt, Fatal: rec.Error.Fatal, Code: rec.Error.Code, Message: rec.Error.Message,
		}
	}
	return rec.Output, nil
}

// park hands s to the executor (unless the body is already parked; s may
// then be nil) and unwinds the workflow goroutine: the body's deferred calls
// run and the goroutine ends.
//
// park never returns: it unwinds the workflow goroutine with runtime.Goexit.
// It is the one place where the body is left without a return, because a
// Step call that cannot produce its step's result must not return to user
// code; it is called from StepWithKey only.
func (c *Context) park(s *settlement) {
	if !c.parked {
		c.parked = true
		c.done <- s
	}
	runtime.Goexit()
}
