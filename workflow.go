package jetflow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
	"github.com/jetflow/jetflow/jetflowtype"
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
	strictInput  bool
	events       map[string]eventType
	versioning   Versioning
	patches      []string
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
	return &Workflow[P, R]{name: name, fn: fn, policy: o.policy, retention: o.retention, requireRunID: o.requireRunID,
		strictInput: o.strictInput, events: o.events, versioning: o.versioning, patches: o.patches}
}

// declaredEvents are the events the workflow declares (WithEvent).
func (w *Workflow[P, R]) declaredEvents() map[string]eventType { return w.events }

// ConflictPolicy is the workflow's default conflict policy.
func (w *Workflow[P, R]) ConflictPolicy() ConflictPolicy { return w.policy }

// Name is the workflow's stable name.
func (w *Workflow[P, R]) Name() string { return w.name }

// Definition is the engine's definition of the workflow: its name, and its
// body on the engine's context. Package jetflowtest's replay check runs it;
// a program has no use for it.
func (w *Workflow[P, R]) Definition() workflow.Definition {
	return workflow.Definition{
		Name: w.name, Pinned: w.versioning == Pinned, Patches: w.patches,
		Run: func(c *workflow.Context, raw json.RawMessage) (json.RawMessage, error) {
			in, err := decodeInput[P](raw)
			if err != nil {
				return nil, err
			}
			out, err := w.fn(&Context{c: c, events: w.events}, in)
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

// served is what the admitter needs to admit starts of w; it fails with
// ErrInvalidConflictPolicy when w's conflict policy is invalid, and with
// ErrInvalidRetention when its retention (WithRetention) is set under a
// second. (The retention's upper bound is the deployment's, which
// NewWorker checks.)
func (w *Workflow[P, R]) served() (startproto.Served, error) {
	if err := dedupe.ValidatePolicy(w.policy); err != nil {
		return startproto.Served{}, fmt.Errorf("workflow %s: %w", w.name, err)
	}
	if w.retention != 0 && w.retention < time.Second {
		return startproto.Served{}, fmt.Errorf("workflow %s: %w: %s is less than a second", w.name, ErrInvalidRetention, w.retention)
	}
	if err := validateVersioning(w.versioning, w.patches); err != nil {
		return startproto.Served{}, fmt.Errorf("workflow %s: %w", w.name, err)
	}
	// The one check of a start's JSON input, at admission (startproto),
	// whichever way the start came.
	check := func(raw json.RawMessage) error {
		_, err := decodeInput[P](raw)
		return err
	}
	if w.strictInput {
		check = checkStrictInput[P]
	}
	return startproto.Served{
		Check:        check,
		Policy:       w.policy,
		Retention:    w.retention,
		RequireRunID: w.requireRunID,
	}, nil
}

func decodeInput[P any](raw json.RawMessage) (P, error) {
	var in P
	if err := json.Unmarshal(raw, &in); err != nil {
		return in, fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return in, nil
}

// checkStrictInput is decodeInput's check with unknown fields refused
// (WithStrictInput). raw is one JSON value (admission validated it).
func checkStrictInput[P any](raw json.RawMessage) error {
	var in P
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return fmt.Errorf("%w: %w (the workflow takes only the fields its input type declares)", ErrInvalidInput, err)
	}
	return nil
}

// Context is what a workflow body gets: the run's identity and the handle
// that Step needs. It is not a context.Context; Context() returns the one
// for cancellation.
type Context struct {
	c      *workflow.Context
	events map[string]eventType
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
// other names are added. fn gets it through StepDetailsFrom; pass it as the
// Idempotency-Key of external calls.
//
// fn runs at least once until its result is committed and never after: a
// repeat call (a replay) returns the committed result without running fn. A
// plain or Retryable error is retried with backoff up to the step's
// MaxAttempts; a Fatal error is not. The final failure is committed and
// returned as a *StepError, which the workflow may handle; its Code is the
// code fn failed with (ErrorWithCode), on every replay. T must round-trip
// through encoding/json.
func Step[T any](ctx *Context, name string, fn func(ctx context.Context) (T, error), opts ...StepOption) (T, error) {
	var zero T
	o, err := stepOpts(name, opts)
	if err != nil {
		return zero, err
	}
	raw, err := ctx.c.StepWithKey(name, o.policy, o.taskKey, encodeStep(name, fn))
	if err != nil {
		return zero, publicStepErr(err)
	}
	return decodeResult[T](name, raw)
}

// StepOption configures one step call.
type StepOption func(*stepOptions)

type stepOptions struct {
	policy  workflow.RetryPolicy
	taskKey workflow.TaskKey // see taskkeys.go
	// err is the first option that was invalid.
	err error
}

// RetryPolicy decides how often and how fast a failing step is retried:
// MaxAttempts, InitialInterval, MaxInterval, Multiplier. Zero fields take
// the defaults: 5 attempts, 1s initial backoff doubling to at most 1m,
// with jitter. See jetflowtype.RetryPolicy for its fields.
type RetryPolicy = jetflowtype.RetryPolicy

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

// StepDetails describes the running step attempt: StepID (deterministic:
// run ID, step name and occurrence, run-42.charge.0; pass it as the
// Idempotency-Key of external calls), StepName, Attempt (from 1; a
// redelivery after a crash is a new attempt), RunID and Workflow.
type StepDetails = jetflowtype.StepDetails

// StepDetailsFrom returns the details of the step running with ctx: its
// deterministic step ID, its name, the attempt number (from 1), the run ID
// and the workflow name. ok is false outside a step.
func StepDetailsFrom(ctx context.Context) (details StepDetails, ok bool) {
	return workflow.InfoFrom(ctx)
}

// Registrable is a workflow definition that a registry accepts:
// any *Workflow[P, R].
type Registrable interface {
	Name() string
	// Definition is the engine's definition (for package jetflowtest).
	Definition() workflow.Definition
	served() (startproto.Served, error)
	declaredEvents() map[string]eventType
}

// Registry is an explicit registry of the workflows a worker serves.
type Registry struct {
	defs map[string]Registrable
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{defs: make(map[string]Registrable)} }

// Register registers workflows. It fails on an invalid name
// (ErrInvalidName), a name registered twice (ErrDuplicateWorkflow) or an
// invalid default conflict policy (ErrInvalidConflictPolicy), and then
// registers none of them.
func (r *Registry) Register(wfs ...Registrable) error {
	seen := make(map[string]bool, len(wfs))
	for _, wf := range wfs {
		if err := state.ValidateName(wf.Name()); err != nil {
			return err
		}
		if _, dup := r.defs[wf.Name()]; dup || seen[wf.Name()] {
			return fmt.Errorf("%w: %q", ErrDuplicateWorkflow, wf.Name())
		}
		if _, err := wf.served(); err != nil {
			return err
		}
		for name := range wf.declaredEvents() {
			if err := state.ValidateName(name); err != nil {
				return fmt.Errorf("workflow %s: event: %w", wf.Name(), err)
			}
		}
		seen[wf.Name()] = true
	}
	for _, wf := range wfs {
		r.defs[wf.Name()] = wf
	}
	return nil
}

// checkRetention fails with ErrInvalidRetention when a registered
// workflow keeps its runs longer than the deployment does (max): every
// start of it would be refused.
func (r *Registry) checkRetention(max time.Duration) error {
	for name, wf := range r.defs {
		s, err := wf.served()
		if err != nil {
			return err
		}
		if s.Retention > max {
			return fmt.Errorf("workflow %s: %w: %s is longer than the deployment's %s (Topology.Retention)", name, ErrInvalidRetention, s.Retention, max)
		}
	}
	return nil
}

// Names lists the registered workflow names.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.defs))
	for n := range r.defs {
		names = append(names, n)
	}
	return names
}
