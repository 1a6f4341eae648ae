package jetflowtest

import (
	"context"
	"sort"
	"sync"

	"github.com/jetflow/jetflow"
)

// Effects stands for an external system a workflow's steps call, such as a
// payment API: it counts the calls it receives per Idempotency-Key (the
// calling step's ID) and applies the first call of each key only, as a
// provider that deduplicates by Idempotency-Key does. It is safe for
// concurrent use.
//
// A step calls Apply from its function; afterwards the test asserts with
// RequireCalledOnce (every step's function ran once), RequireApplied
// (exactly these keys took effect, however often they were called) and
// Calls (how often a step's function ran: once, unless its worker crashed
// before the result was committed).
type Effects struct {
	mu    sync.Mutex
	calls map[string]int
	order []string
	bad   int
}

// NewEffects returns an Effects that has received no call.
func NewEffects() *Effects { return &Effects{calls: map[string]int{}} }

// Apply records one call made from the step whose context ctx is, under
// its step ID, and reports whether it is the key's first call: the one
// that takes effect. A call from outside a step (no step ID) is recorded
// as a call without a key, which RequireCalledOnce and RequireApplied
// fail. A call that a step of a crashed worker makes after the crash (its
// function ignored its cancelled context) is not recorded, and returns
// false: a killed process makes no call.
func (e *Effects) Apply(ctx context.Context) (first bool) {
	if killedStep(ctx) {
		return false // the call of a worker the Env killed: it never reached anyone
	}
	d, ok := jetflow.StepDetailsFrom(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if !ok || d.StepID == "" {
		e.bad++
		return true
	}
	e.calls[d.StepID]++
	if e.calls[d.StepID] == 1 {
		e.order = append(e.order, d.StepID)
		return true
	}
	return false
}

// Calls is how many calls carried the key stepID.
func (e *Effects) Calls(stepID string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[stepID]
}

// Keys are the keys applied, in the order of their first calls.
func (e *Effects) Keys() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.order...)
}

// Repeated are the keys called more than once, sorted: the steps whose
// function ran again, which the provider's deduplication absorbed.
func (e *Effects) Repeated() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var keys []string
	for k, n := range e.calls {
		if n > 1 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// RequireCalledOnce fails t unless every key was called exactly once and
// every call carried a key: no step's function ran twice.
func (e *Effects) RequireCalledOnce(t T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.bad > 0 {
		t.Fatalf("jetflowtest: %d effect call(s) made outside a step, without an Idempotency-Key", e.bad)
	}
	for _, k := range e.order {
		if n := e.calls[k]; n != 1 {
			t.Fatalf("jetflowtest: step %s called its effect %d times, want once", k, n)
		}
	}
}

// RequireApplied fails t unless exactly the steps stepIDs applied an
// effect (in any order), each carrying its key: the effect of each
// happened once at the provider, however often it was called.
func (e *Effects) RequireApplied(t T, stepIDs ...string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.bad > 0 {
		t.Fatalf("jetflowtest: %d effect call(s) made outside a step, without an Idempotency-Key", e.bad)
	}
	want := map[string]bool{}
	for _, id := range stepIDs {
		want[id] = true
		if e.calls[id] == 0 {
			t.Fatalf("jetflowtest: step %s applied no effect; applied: %v", id, e.order)
		}
	}
	for _, k := range e.order {
		if !want[k] {
			t.Fatalf("jetflowtest: step %s applied an effect it should not have; want only %v", k, stepIDs)
		}
	}
}
