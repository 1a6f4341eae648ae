package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/state"
)

// ErrUndeclaredPatch: Patched with a patch ID its workflow does not
// declare (jetflow.WithPatch): a typo that would make every run take the
// old code's way.
var ErrUndeclaredPatch = errors.New("jetflow: patch not declared by the workflow")

// Patched reports whether the run takes the way of the code that has the
// patch id at this point of the body: true for a run that reaches it under
// such code, false for a run that went past it under code without the
// patch (its history holds steps at or after this place). The answer is
// committed the first time a holder gives it (a patch marker: a record
// of kind state.StepPatch that takes no place in the order of steps), so
// that every replay answers the same; a repeat call with the same id in
// one replay gets the first answer. A patch the definition does not
// declare panics with ErrUndeclaredPatch: the run fails, the same way on
// every worker, and the test kit's replay check reports it.
//
// Code may drop a Patched call (keeping the patched way) once no run that
// passed the point without it is in flight: its markers take no place,
// and a replay that does not ask about them ignores them.
func (c *Context) Patched(id string) bool {
	if err := c.onBody(); err != nil {
		// A goroutine of the body's own: refused (a panic there would
		// crash the worker). It answers the old way, commits nothing, and
		// a replay check reports the call (ErrWrongGoroutine).
		if c.delivery != nil {
			c.log.Error().Err(err).Str("patch", id).Msg("Patched called from a goroutine of the body's own: answered false")
		}
		return false
	}
	if c.parked {
		c.park(nil)
	}
	if !slices.Contains(c.def.Patches, id) {
		panic(fmt.Errorf("%w: %q (declare it with jetflow.WithPatch)", ErrUndeclaredPatch, id))
	}
	if v, ok := c.patched[id]; ok {
		return v
	}
	stepID := state.StepID(state.RunIdentity(c.run.RunID, c.run.Generation), state.PatchStepName(id), 0)
	var v bool
	switch c.mode {
	case modeCheck:
		v = c.check.patched(stepID, c.seq)
	default:
		v = c.hist.get(stepID) != nil || c.hist.last < c.seq
		if v && c.mode == modeHolder && c.hist.get(stepID) == nil {
			// The steps started since the last await are compared
			// first: code that departs from the history commits no
			// marker (a later build would read it as its own answer).
			if d := c.divergent(c.open, false); d != nil {
				c.park(c.blocked(d))
			}
			rec := &state.Step{V: state.Version, StepID: stepID, RunID: c.run.RunID, Name: state.PatchStepName(id),
				Attempt: 1, Kind: state.StepPatch, Output: json.RawMessage("true"), Worker: c.exec.cfg.WorkerID, Build: c.exec.cfg.Build}
			stored, s := c.exec.commitRecord(c.delivery, rec)
			if s != nil {
				c.park(s)
			}
			c.hist.put(stored)
		}
	}
	if c.patched == nil {
		c.patched = make(map[string]bool)
	}
	c.patched[id] = v
	return v
}

// patched is Context.Patched's answer in a replay check: the history holds
// the marker, or no step at place seq or later.
func (ck *checker) patched(stepID string, seq int) bool {
	if _, ok := ck.steps[stepID]; ok {
		return true
	}
	for _, rec := range ck.steps {
		if placed(rec) && rec.Seq >= seq {
			return false
		}
	}
	return true
}
