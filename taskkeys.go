package jetflow

import (
	"context"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Task keys (G7): a step call can carry a key whose result is reused, for a
// time-to-live, by every call with the same key in its scope, without
// running the step again:
//
//	msg, err := jetflow.Step(ctx, "send-email", send,
//		jetflow.WithTaskKey("welcome/"+userID, 24*time.Hour),
//		jetflow.WithKeyScope(jetflow.ScopeWorkflow))
//
// Within the TTL a committed result for the key is returned without running
// the step; the call's own step record is still committed under its step ID
// (Client.Steps names the key it was served from, in StepRecord.TaskKey).
// A final failure is not cached unless WithCachedFailures is given: the
// next call runs the step.
// Concurrent calls with one key run the step once; the others wait for its
// result. A different key, or the same key in another scope, runs the step.
// The step name is part of the key's identity: two steps that use the same
// key string never share a result.
//
// The key is kept in the KV bucket jetflow_taskkeys with a per-key TTL
// (JetStream's message TTL, whole seconds, rounded up): it disappears when
// its TTL passes or through Client.ResetTaskKey, never otherwise. See
// docs/ARCHITECTURE.md, "Task keys".
//
// A task key is neither the run ID (a start's idempotency key) nor the step
// ID (what StepDetails gives an external API as its Idempotency-Key): it is
// the caller's name for a result that several step calls share.

// KeyScope says who shares a task key: ScopeRun, ScopeWorkflow or
// ScopeGlobal. Its String is the scope's name: "run", "workflow" or
// "global".
type KeyScope = jetflowtype.KeyScope

const (
	// ScopeRun (the default): the key is private to the run; a run started
	// again under the same run ID (StartNew, or a start after the
	// retention) is another run and does not share it.
	ScopeRun = jetflowtype.ScopeRun
	// ScopeWorkflow: the key is shared by every run of the workflow.
	ScopeWorkflow = jetflowtype.ScopeWorkflow
	// ScopeGlobal: the key is shared by every run of every workflow.
	ScopeGlobal = jetflowtype.ScopeGlobal
)

// MaxTaskKeyLen is the longest task key, in bytes. Any bytes are allowed:
// the key is stored as a hash.
const MaxTaskKeyLen = 512

// WithTaskKey gives the step call a task key: within ttl (at least 1s) of
// the key's result, calls with the same key in the same scope (see
// WithKeyScope) return that result without running the step.
func WithTaskKey(key string, ttl time.Duration) StepOption {
	return func(o *stepOptions) {
		o.taskKey.Key, o.taskKey.Set, o.taskKey.TTL = key, true, ttl
	}
}

// WithKeyScope sets the task key's scope (default ScopeRun). A scope
// outside the constants makes the step call return ErrInvalidKey.
func WithKeyScope(scope KeyScope) StepOption {
	return func(o *stepOptions) {
		if err := state.ValidateKeyScope(scope); err != nil && o.err == nil {
			o.err = err
		}
		o.taskKey.Scope, o.taskKey.Others = scope, true
	}
}

// WithCachedFailures caches the step's final failure (fatal, or out of
// attempts) under its task key too, so that calls within the TTL get the
// same *StepError without running. By default a failure is not cached and
// the next call runs the step. A cached entry is served to every caller of
// the key, whether it asked for cached failures or not.
func WithCachedFailures() StepOption {
	return func(o *stepOptions) { o.taskKey.CacheFailures, o.taskKey.Others = true, true }
}

// WithKeyLease sets how long a claim on the task key, held by a worker that
// runs the step, survives that worker's death (default 90s, three default
// AckWaits; at least 1s). A running step renews its claim every third of
// the lease; when a claim is not renewed for a whole lease, a waiting call
// takes the key over and runs the step itself. The crashed step's own task
// takes its claim back at once when it is redelivered.
func WithKeyLease(d time.Duration) StepOption {
	return func(o *stepOptions) { o.taskKey.Lease, o.taskKey.Others = d, true }
}

// DefaultKeyLease is the lease of a task key claim without WithKeyLease.
const DefaultKeyLease = 90 * time.Second

// ResetTaskKey forgets key in scope, for every step that uses it, so that
// the next call runs the step again. scopeID is the run ID for ScopeRun
// (every generation of the run), the workflow name for ScopeWorkflow, and
// empty for ScopeGlobal. It returns how
// many step entries it removed (0 when the key was not set or had expired).
// A step running under the key when it is reset still commits its own
// record but does not cache its result.
func (c *Client) ResetTaskKey(ctx context.Context, key string, scope KeyScope, scopeID string) (_ int, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateKeyScope(scope); err != nil {
		return 0, err
	}
	filter, err := state.TaskKeyFilter(scope, scopeID, key)
	if err != nil {
		return 0, err
	}
	return workflow.ResetTaskKeys(ctx, c.assets.TaskKeys, filter, time.Now)
}
