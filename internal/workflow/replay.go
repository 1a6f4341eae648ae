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

// replay runs the workflow body in its own goroutine until it returns or
// suspends at a step.
func (e *Executor) replay(c *Context, def Definition) *settlement {
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
// steps bucket.
func (e *Executor) lookup(ctx context.Context, runKey, stepID string) (state.Step, bool, error) {
	if s, ok := e.cache.get(runKey, stepID); ok {
		return s, true, nil
	}
	v, _, err := e.cfg.Assets.Steps.Get(ctx, stepID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return state.Step{}, false, nil
	}
	if err != nil {
		return state.Step{}, false, err
	}
	s, err := state.DecodeStep(v)
	if err != nil {
		return state.Step{}, false, err
	}
	e.cache.put(runKey, s)
	return s, true, nil
}

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
