package workflow

import (
	"context"
	"fmt"

	"github.com/jetflow/jetflow/internal/state"
)

// history is what a delivery knows of a run generation's records in the
// steps bucket: its committed steps by step ID and its lease record. A
// delivery reads them all with one batch read (readHistory), a consistent
// snapshot; a run's first holder reads nothing (newHistory), as nothing
// can be committed yet but what others deliver to it (events, a child's
// end), which it looks up one by one.
type history struct {
	steps map[string]*state.Step
	// lease is the lease record and its revision (nil, 0: none).
	lease    *state.Lease
	leaseRev uint64
}

func newHistory() *history { return &history{steps: make(map[string]*state.Step)} }

// readHistory reads every record of the run generation identity.
func (e *Executor) readHistory(ctx context.Context, identity string) (*history, error) {
	entries, err := e.cfg.Assets.Steps.Prefix(ctx, identity)
	if err != nil {
		return nil, err
	}
	h := &history{steps: make(map[string]*state.Step, len(entries))}
	for _, ent := range entries {
		if state.IsLeaseKey(ent.Key) {
			l, err := state.DecodeLease(ent.Value)
			if err != nil {
				return nil, fmt.Errorf("lease of %s: %w", identity, err)
			}
			h.lease, h.leaseRev = &l, ent.Rev
			continue
		}
		rec, err := state.DecodeStep(ent.Value)
		if err != nil {
			return nil, fmt.Errorf("step %s: %w", ent.Key, err)
		}
		rec.Rev = ent.Rev
		h.steps[rec.StepID] = &rec
	}
	return h, nil
}

// get returns the committed record of stepID, or nil.
func (h *history) get(stepID string) *state.Step { return h.steps[stepID] }

// put records rec, just committed or found.
func (h *history) put(rec *state.Step) { h.steps[rec.StepID] = rec }
