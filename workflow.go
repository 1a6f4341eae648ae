package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// Workflow is a workflow definition: a stable name and a typed body. Define
// it once, at package level, and use the same value to register it on a
// worker and to start runs.
type Workflow[P, R any] struct {
	name         string
	fn           func(*Context, P) (R, error)
	policy       ConflictPolicy
	retention    time.Duration
	requireRunID bool
}

// NewWorkflow defines a workflow. name is its identity in stored runs and on
// NATS subjects: keep it stable across deploys and independent of the Go
// function name (1..64 characters of [A-Za-z0-9_-]; checked when the workflow
// is registered or started).
//
// fn is the orchestration: it calls steps with Step, branches on their
// results and returns. It is replayed from the top for every step, so it
// must be deterministic and do its I/O only inside steps.
func NewWorkflow[P, R any](name string, fn func(ctx *Context, input P) (R, error), opts ...WorkflowOption) *Workflow[P, R] {
	var o workflowOptions
	for _, opt := range opts {
		opt(&o)
	}
	return &Workflow[P, R]{name: name, fn: fn, policy: o.policy, retention: o.retention, requireRunID: o.requireRunID}
}

// ConflictPolicy is the workflow's default conflict policy.
func (w *Workflow[P, R]) ConflictPolicy() ConflictPolicy { return w.policy }

// Name is the workflow's stable name.
func (w *Workflow[P, R]) Name() string { return w.name }

func (w *Workflow[P, R]) definition() workflow.Definition {
	return workflow.Definition{
		Name: w.name,
		Run: func(c *workflow.Context, raw json.RawMessage) (json.RawMessage, error) {
			in, err := decodeInput[P](raw)
			if err != nil {
				return nil, err
			}
			out, err := w.fn(&Context{c: c}, in)
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(out)
			if err != nil {
				return nil, fmt.Errorf("jetflow: encode output of workflow %s: %w", w.name, err)
			}
			return b, nil
		},
	}
}

func (w *Workflow[P, R]) served() startproto.Served {
	return startproto.Served{
		Check: func(raw json.RawMessage) error {
			_, err := decodeInput[P](raw)
			return err
		},
		Policy:       w.policy.internal(),
		Retention:    w.retention,
		RequireRunID: w.requireRunID,
	}
}

func decodeInput[P any](raw json.RawMessage) (P, error) {
	var in P
	if err := json.Unmarshal(raw, &in); err != nil {
		return in, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return in, nil
}

// Context is what a workflow body gets: the run's identity and the handle
// that Step needs. It is not a context.Context; Context() returns the one
// for cancellation.
type Context struct {
	c *workflow.Context
}

// RunID is the run's ID: the caller's idempotency key, or a generated one.
func (c *Context) RunID() string { return c.c.RunID() }

// WorkflowName is the workflow's stable name.
func (c *Context) WorkflowName() string { return c.c.Workflow() }

// Context is cancelled when the worker stops waiting for in-flight steps.
func (c *Context) Context() context.Context { return c.c.Context() }

// Step runs fn as the step called name, or returns its committed result.
//
// The step's ID is derived from the run ID, name and how many times name was
// called before in this run (run-42.charge.0, run-42.charge.1 ...), so it is
// the same on every retry and replay and does not change when steps with
// other names are added. fn gets it through StepInfo; pass it as the
// Idempotency-Key of external calls.
//
// fn runs at least once until its result is committed and never after: a
// repeat call (a replay) returns the committed result without running fn. A
// plain or Retryable error is retried with backoff up to the step's
// MaxAttempts; a Fatal error is not. The final failure is committed and
// returned as a *StepError, which the workflow may handle. T must round-trip
// through encoding/json.
func Step[T any](ctx *Context, name string, fn func(ctx context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	var o stepOptions
	for _, opt := range opts {
		opt(&o)
	}
	raw, err := ctx.c.StepWithKey(name, o.policy, o.taskKey, func(sctx context.Context) (json.RawMessage, error) {
		v, err := fn(sctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, Fatal(fmt.Errorf("encode result of step %s: %w", name, err))
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		return zero, fmt.Errorf("jetflow: step %s: committed result does not decode into %T: %w", name, out, err)
	}
	return out, nil
}

// StepOption configures one step call.
type StepOption func(*stepOptions)

type stepOptions struct {
	policy  workflow.RetryPolicy
	taskKey workflow.TaskKey // see taskkeys.go
}

// RetryPolicy decides how often and how fast a failing step is retried.
// Zero fields take the defaults: 5 attempts, 1s initial backoff doubling to
// at most 1m, with jitter.
type RetryPolicy = workflow.RetryPolicy

// WithRetry sets the step's retry policy. An invalid policy makes the step
// call return ErrInvalidPolicy.
func WithRetry(p RetryPolicy) StepOption {
	return func(o *stepOptions) { o.policy = p }
}

// WithMaxAttempts sets only the number of attempts (1 = no retries).
func WithMaxAttempts(n int) StepOption {
	return func(o *stepOptions) { o.policy.MaxAttempts = n }
}

// WithBackoff sets only the backoff bounds.
func WithBackoff(initial, maxInterval time.Duration) StepOption {
	return func(o *stepOptions) { o.policy.InitialInterval, o.policy.MaxInterval = initial, maxInterval }
}

// StepDetails describes the running step attempt.
type StepDetails = workflow.StepInfo

// StepInfo returns the details of the step running with ctx: its
// deterministic step ID, its name, the attempt number (from 1), the run ID and
// the workflow name. ok is false outside a step.
func StepInfo(ctx context.Context) (details StepDetails, ok bool) {
	return workflow.InfoFrom(ctx)
}

// Registrable is a workflow definition that a registry accepts:
// any *Workflow[P, R].
type Registrable interface {
	Name() string
	definition() workflow.Definition
	served() startproto.Served
}

// Workers is an explicit registry of the workflows a worker serves.
type Workers struct {
	defs map[string]Registrable
}

// NewWorkers returns an empty registry.
func NewWorkers() *Workers { return &Workers{defs: make(map[string]Registrable)} }

// Add registers workflows. It fails on an invalid name or a name registered
// twice, and then registers none of them.
func (ws *Workers) Add(wfs ...Registrable) error {
	seen := make(map[string]bool, len(wfs))
	for _, wf := range wfs {
		if err := state.ValidateName(wf.Name()); err != nil {
			return err
		}
		if _, dup := ws.defs[wf.Name()]; dup || seen[wf.Name()] {
			return fmt.Errorf("%w: %q", ErrDuplicateWorkflow, wf.Name())
		}
		seen[wf.Name()] = true
	}
	for _, wf := range wfs {
		ws.defs[wf.Name()] = wf
	}
	return nil
}

// Names lists the registered workflow names.
func (ws *Workers) Names() []string {
	names := make([]string, 0, len(ws.defs))
	for n := range ws.defs {
		names = append(names, n)
	}
	return names
}
