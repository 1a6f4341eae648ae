package jetflowtest

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/workflow"
)

// stubKey names the steps a stub replaces: those called step, of the
// workflow wf ("" for any workflow).
type stubKey struct{ wf, step string }

// Stub replaces the function of every step called step, in every workflow
// the Env serves, with fn, from the next call of the step on: the workflow
// body is not touched, and the step keeps its ID, retries, task key and
// commit. fn's result is encoded to JSON as the real step's would be, so
// it must have the type the body reads the step's result as.
//
// A later Stub of the same step replaces the earlier one.
func Stub[T any](e *Env, step string, fn func(ctx context.Context) (T, error)) {
	e.setStub(stubKey{step: step}, encode(step, fn))
}

// StubIn is Stub for the steps called step of workflow wf only.
func StubIn[T any](e *Env, wf, step string, fn func(ctx context.Context) (T, error)) {
	e.setStub(stubKey{wf: wf, step: step}, encode(step, fn))
}

func (e *Env) setStub(k stubKey, fn workflow.StepFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stubs[k] = fn
}

// stub is the stub for step of workflow wf, or nil.
func (e *Env) stub(wf, step string) workflow.StepFunc {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fn, ok := e.stubs[stubKey{wf: wf, step: step}]; ok {
		return fn
	}
	return e.stubs[stubKey{step: step}]
}

// encode turns a typed stub into the engine's step function, which
// returns JSON; a result that cannot be encoded fails the step for good,
// as it would the real step.
func encode[T any](step string, fn func(ctx context.Context) (T, error)) workflow.StepFunc {
	return func(ctx context.Context) (json.RawMessage, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, jetflow.Fatal(fmt.Errorf("jetflowtest: encode result of stub %s: %w", step, err))
		}
		return b, nil
	}
}
