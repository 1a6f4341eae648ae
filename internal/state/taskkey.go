package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/jetflowtype"
)

// Task idempotency keys (G7). A step call may carry a caller-chosen key; the
// key's entry in the task-keys bucket holds either the claim of the step
// that is producing the result or the result itself, for the key's TTL.

// ErrInvalidTaskKey: a task key, its scope, its TTL or its lease is not
// acceptable.
var ErrInvalidTaskKey = errors.New("jetflow: invalid task key")

// Limits of task keys.
const (
	// MaxTaskKeyLen bounds the caller's key (any bytes; it is hashed).
	MaxTaskKeyLen = 512
	// MinTaskKeyTTL is the shortest TTL (and lease) JetStream accepts on a
	// message; TTLs are kept in whole seconds, rounded up.
	MinTaskKeyTTL = time.Second
)

// KeyScope says who shares a task key: jetflowtype.KeyScope (the root
// package's KeyScope), named here for the engine.
type KeyScope = jetflowtype.KeyScope

// Scopes. The zero value is the run scope.
const (
	// ScopeRun: the key is private to one run (one generation of a run
	// ID, see RunTaskKeyName).
	ScopeRun = jetflowtype.ScopeRun
	// ScopeWorkflow: shared by every run of one workflow.
	ScopeWorkflow = jetflowtype.ScopeWorkflow
	// ScopeGlobal: shared by every run of every workflow.
	ScopeGlobal = jetflowtype.ScopeGlobal
)

// ValidateKeyScope returns ErrInvalidTaskKey for a scope outside the
// constants: an unknown scope is an error, never a default.
func ValidateKeyScope(s KeyScope) error {
	switch s {
	case ScopeRun, ScopeWorkflow, ScopeGlobal:
		return nil
	}
	return fmt.Errorf("%w: KeyScope(%d)", ErrInvalidTaskKey, int(s))
}

// ValidateTaskKey checks a caller's key: 1..MaxTaskKeyLen bytes.
func ValidateTaskKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidTaskKey)
	case len(key) > MaxTaskKeyLen:
		return fmt.Errorf("%w: key is %d bytes, limit %d", ErrInvalidTaskKey, len(key), MaxTaskKeyLen)
	}
	return nil
}

// TaskKeyPrefix is the part of a task key's bucket key that the scope
// decides: r.<run-id>, w.<workflow> or g. scopeID is the run ID or the
// workflow name, and must be empty for the global scope.
func TaskKeyPrefix(scope KeyScope, scopeID string) (string, error) {
	switch scope {
	case ScopeRun:
		if err := ValidateRunID(scopeID); err != nil {
			return "", fmt.Errorf("%w: run scope: %w", ErrInvalidTaskKey, err)
		}
		return "r." + scopeID, nil
	case ScopeWorkflow:
		if err := ValidateName(scopeID); err != nil {
			return "", fmt.Errorf("%w: workflow scope: %w", ErrInvalidTaskKey, err)
		}
		return "w." + scopeID, nil
	case ScopeGlobal:
		if scopeID != "" {
			return "", fmt.Errorf("%w: the global scope takes no scope ID, got %q", ErrInvalidTaskKey, clip(scopeID))
		}
		return "g", nil
	default:
		return "", fmt.Errorf("%w: unknown scope %d", ErrInvalidTaskKey, int(scope))
	}
}

// TaskKeyHash is the bucket token of a caller's key: 32 hex digits of its
// SHA-256 (KV keys allow only [-/_=.A-Za-z0-9], so the key itself, which may
// be any bytes, is never stored).
func TaskKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// TaskKeyName is the bucket key of key, called by the step named step, in
// scope: <prefix>.<hash>.<step>, for example
// w.orders.6f1c...9a.send-email. The step name is part of the identity, so
// two steps that happen to use one key never read each other's results;
// a reset of the key covers every step (<prefix>.<hash>.*).
func TaskKeyName(scope KeyScope, scopeID, step, key string) (string, error) {
	if err := ValidateTaskKey(key); err != nil {
		return "", err
	}
	if err := ValidateName(step); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidTaskKey, err)
	}
	prefix, err := TaskKeyPrefix(scope, scopeID)
	if err != nil {
		return "", err
	}
	return prefix + "." + TaskKeyHash(key) + "." + step, nil
}

// RunTaskKeyName is the bucket key of a run-scoped key, called by the step
// named step in generation generation of the run runID (see RunIdentity):
// TaskKeyName(ScopeRun, runID, step, key) for the first generation, with
// ".<generation>" appended for a later one. A run started again under the
// same run ID (the conflict policy's "start new", or a start after the
// retention) is another run and never meets its predecessor's cached
// results; a reset of the run's key (TaskKeyFilter) covers every
// generation.
func RunTaskKeyName(runID string, generation int, step, key string) (string, error) {
	name, err := TaskKeyName(ScopeRun, runID, step, key)
	if err != nil || generation == 0 {
		return name, err
	}
	if generation < 0 {
		return "", fmt.Errorf("%w: negative generation %d", ErrInvalidTaskKey, generation)
	}
	return name + "." + strconv.Itoa(generation), nil
}

// TaskKeyFilter matches the bucket keys of key for every step in scope
// (<prefix>.<hash>.>), and in the run scope for every generation of the run.
func TaskKeyFilter(scope KeyScope, scopeID, key string) (string, error) {
	if err := ValidateTaskKey(key); err != nil {
		return "", err
	}
	prefix, err := TaskKeyPrefix(scope, scopeID)
	if err != nil {
		return "", err
	}
	return prefix + "." + TaskKeyHash(key) + ".>", nil
}

// Task key entry states.
const (
	// TaskKeyClaimed: a step holds the key and is producing the result.
	// The entry's message TTL is the lease; the holder renews it while the
	// step runs.
	TaskKeyClaimed = "claimed"
	// TaskKeyDone: the result, kept for the key's TTL.
	TaskKeyDone = "done"
	// TaskKeyReset: the key was reset (Client.ResetTaskKey). The entry
	// stands for no entry at all; it is written over the reset one, not
	// purged, and outlives that one's own time, so that a removal the
	// server undoes after an unclean stop never brings the reset entry
	// back as the key's value (see Gone).
	TaskKeyReset = "reset"
)

// TaskKeyEntry is the value of a task key in the task-keys bucket.
type TaskKeyEntry struct {
	V     int    `json:"v"`
	State string `json:"state"`
	// Owner is the step ID that claimed the key, or that produced the
	// result.
	Owner string `json:"owner"`
	// Token identifies one claim, so that a holder recognises its own
	// write after a lost reply.
	Token  string `json:"token"`
	Worker string `json:"worker,omitempty"`
	// LeaseMS is the claim's lease in milliseconds: a waiter that sees the
	// same revision for longer (by its own clock) may take the key over.
	LeaseMS    int64     `json:"lease_ms,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"` // for people reading the bucket
	// The result (state done).
	Output    json.RawMessage `json:"output,omitempty"`
	Error     *ErrorInfo      `json:"error,omitempty"`
	Attempt   int             `json:"attempt,omitempty"`
	At        time.Time       `json:"at"`
	ExpiresAt time.Time       `json:"expires_at,omitzero"`
}

// Lease is the claim's lease.
func (e TaskKeyEntry) Lease() time.Duration { return time.Duration(e.LeaseMS) * time.Millisecond }

// Gone reports whether e, an entry the bucket holds, stands for no entry at
// now: a reset, or a result past its ExpiresAt. The bucket removes a result
// when its TTL passes, but a removal can be undone by an unclean stop of
// the server (the key then comes back with its last value and no TTL), so
// the time in the entry decides, by the reader's clock (a clock ahead of
// the writer's ends the result that much early). A claim is never gone by
// its time: a waiter takes over a claim that is not renewed for a lease.
func (e TaskKeyEntry) Gone(now time.Time) bool {
	switch e.State {
	case TaskKeyReset:
		return true
	case TaskKeyDone:
		return !e.ExpiresAt.IsZero() && !now.Before(e.ExpiresAt)
	}
	return false
}

// Until is how long after now e, an entry that is not Gone, may still be
// served or waited on: a result until its ExpiresAt, a claim for a lease
// after its last write (LeaseUntil).
func (e TaskKeyEntry) Until(now time.Time) time.Duration {
	end := e.ExpiresAt
	if e.State == TaskKeyClaimed {
		end = e.LeaseUntil
	}
	return max(end.Sub(now), 0)
}

// DecodeTaskKeyEntry decodes and validates a task key entry.
func DecodeTaskKeyEntry(b []byte) (TaskKeyEntry, error) {
	var e TaskKeyEntry
	if err := decode(b, &e); err != nil {
		return TaskKeyEntry{}, err
	}
	switch e.State {
	case TaskKeyClaimed:
		if e.LeaseMS < MinTaskKeyTTL.Milliseconds() {
			return TaskKeyEntry{}, fmt.Errorf("%w: task key claim with lease %dms", ErrCorrupt, e.LeaseMS)
		}
	case TaskKeyDone:
	case TaskKeyReset:
		if e.Token == "" {
			return TaskKeyEntry{}, fmt.Errorf("%w: task key reset without token", ErrCorrupt)
		}
		return e, checkTimes("task key entry", e.At, e.ExpiresAt, e.LeaseUntil)
	default:
		return TaskKeyEntry{}, fmt.Errorf("%w: task key state %q", ErrCorrupt, clip(e.State))
	}
	if e.Owner == "" || e.Token == "" {
		return TaskKeyEntry{}, fmt.Errorf("%w: task key entry without owner", ErrCorrupt)
	}
	if e.Attempt < 0 {
		return TaskKeyEntry{}, fmt.Errorf("%w: task key entry: negative attempt", ErrCorrupt)
	}
	if err := checkTimes("task key entry", e.At, e.ExpiresAt, e.LeaseUntil); err != nil {
		return TaskKeyEntry{}, err
	}
	return e, nil
}

// StepKeyRef is stored with a step record whose result came from a task
// key: which key, and which step produced the result.
type StepKeyRef struct {
	// Key is the bucket key (scope, hash, step).
	Key string `json:"key"`
	// From is the step ID whose run produced the result.
	From string `json:"from"`
	// Served is true when this step did not run: its result was served
	// from the key.
	Served bool `json:"served"`
}

// KeyedStep is a step record with its task key reference. It encodes as
// the Step's fields plus "task_key", so DecodeStep reads it as a Step.
type KeyedStep struct {
	Step
	TaskKey *StepKeyRef `json:"task_key,omitempty"`
}

// DecodeKeyedStep decodes a step record as DecodeStep does, with its task
// key reference (nil for a step called without a key).
func DecodeKeyedStep(b []byte) (KeyedStep, error) {
	s, err := DecodeStep(b)
	if err != nil {
		return KeyedStep{}, err
	}
	var ks struct {
		TaskKey *StepKeyRef `json:"task_key"`
	}
	if err := decode(b, &ks); err != nil {
		return KeyedStep{}, err
	}
	if ks.TaskKey != nil && (ks.TaskKey.Key == "" || ks.TaskKey.From == "") {
		return KeyedStep{}, fmt.Errorf("%w: step record %q: task key reference without key or step", ErrCorrupt, clip(s.StepID))
	}
	return KeyedStep{Step: s, TaskKey: ks.TaskKey}, nil
}
