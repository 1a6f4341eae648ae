package state

import (
	"fmt"
	"strings"
	"time"
)

// WaitChild is the kind of a wait for a child run to end (Wait.Kind); the
// other kinds are the wait steps' own: StepSleep, StepEvent, StepHook.
const WaitChild = "child"

// Wait is the record of a wait a run began: a sleep, a wait for an event
// or a hook, or a parent's wait for a child run. The holder that first
// begins the wait writes it in the attempts bucket under WaitKey(StepID),
// create-if-absent, before it stores what will end the wait, so the first
// beginning's time and deadline stay when a later holder begins the same
// wait again. The wait is open while its step has no committed record; the
// record stays after, and gives an event's record, which its sender
// commits without knowing where the wait stands in the body, its place in
// call order (Seq).
type Wait struct {
	V      int    `json:"v"`
	StepID string `json:"step_id"`
	// Seq is the wait's step's place in call order (Step.Seq).
	Seq  int    `json:"seq"`
	Kind string `json:"kind"`
	// Event is the event an event or hook wait waits for; Token a hook's
	// token; Child the run ID of the child a parent waits for.
	Event string `json:"event,omitempty"`
	Token string `json:"token,omitempty"`
	Child string `json:"child,omitempty"`
	// Since is when the wait began; Until when it ends without an event or
	// a child's end (a sleep's end, a wait's timeout), zero when it has no
	// deadline.
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitzero"`
}

// waitKeySuffix ends a wait's key in the attempts bucket: a step ID ends
// in its occurrence, a number, so the two never collide.
const waitKeySuffix = ".wait"

// WaitKey is the attempts-bucket key of the wait of step stepID.
func WaitKey(stepID string) string { return stepID + waitKeySuffix }

// WaitKeys is the attempts-bucket filter that matches the wait records
// of the run whose records are keyed by identity (RunIdentity).
func WaitKeys(identity string) string { return identity + ".*.*" + waitKeySuffix }

// RerunCopiedKey is the attempts-bucket key that says the run generation
// identity, a rerun, holds every record it takes from its source
// (Run.Rerun): its holders read it instead of the source.
func RerunCopiedKey(identity string) string { return identity + ".rerun" }

// IsWaitKey reports whether an attempts-bucket key is a wait's.
func IsWaitKey(key string) bool { return strings.HasSuffix(key, waitKeySuffix) }

// DecodeWait reads a wait record.
func DecodeWait(b []byte) (Wait, error) {
	var w Wait
	if err := decode(b, &w); err != nil {
		return Wait{}, fmt.Errorf("wait record: %w", err)
	}
	if err := checkTimes("wait record", w.Since, w.Until); err != nil {
		return Wait{}, err
	}
	switch w.Kind {
	case StepSleep, StepEvent, StepHook, WaitChild:
	default:
		return Wait{}, fmt.Errorf("%w: wait record %s: unknown kind %q", ErrCorrupt, w.StepID, w.Kind)
	}
	if w.Seq < 0 || w.StepID == "" {
		return Wait{}, fmt.Errorf("%w: wait record: step %q, seq %d", ErrCorrupt, w.StepID, w.Seq)
	}
	return w, nil
}
