package workflow

import (
	"context"
	"fmt"

	"github.com/jetflow/jetflow/internal/jetstream"
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
	// upto is the highest revision of the step records known (0: none):
	// a branch task the holder publishes reads the run's records as they
	// stood there, which holds every record the body's replay needs to
	// reach the branch (state.Task.Upto).
	upto uint64
}

func newHistory() *history { return &history{steps: make(map[string]*state.Step)} }

// readHistory reads every record of the run generation identity, as the
// records stood at revision upTo of the steps bucket (0: now). It may be a
// replica's stale snapshot: good for a branch, which replays as far as
// records its publisher saw, and for liveness checks.
func (e *Executor) readHistory(ctx context.Context, identity string, upTo uint64) (*history, error) {
	entries, err := e.cfg.Assets.Steps.Prefix(ctx, identity, upTo)
	return decodeHistory(identity, entries, err)
}

// readFenced reads every record of the run generation identity in a
// snapshot that holds the run's lease record at revision leaseRev or
// later, and at least as late as it stood when the read began: every
// commit fenced by an earlier lease revision is in it. A holder decides
// what to run on nothing less.
func (e *Executor) readFenced(ctx context.Context, identity string, leaseRev uint64) (*history, error) {
	entries, err := e.cfg.Assets.Steps.PrefixFenced(ctx, identity, state.LeaseKey(identity), leaseRev)
	return decodeHistory(identity, entries, err)
}

func decodeHistory(identity string, entries []jetstream.Entry, err error) (*history, error) {
	if err != nil {
		return nil, err
	}
	h := &history{steps: make(map[string]*state.Step, len(entries))}
	if err := h.add(entries); err != nil {
		return nil, fmt.Errorf("records of %s: %w", identity, err)
	}
	return h, nil
}

// add decodes entries, records of one run generation, into h.
func (h *history) add(entries []jetstream.Entry) error {
	for _, ent := range entries {
		if state.IsLeaseKey(ent.Key) {
			l, err := state.DecodeLease(ent.Value)
			if err != nil {
				return fmt.Errorf("lease: %w", err)
			}
			h.lease, h.leaseRev = &l, ent.Rev
			continue
		}
		rec, err := state.DecodeStep(ent.Value)
		if err != nil {
			return fmt.Errorf("step %s: %w", ent.Key, err)
		}
		rec.Rev = ent.Rev
		h.put(&rec)
	}
	return nil
}

// get returns the committed record of stepID, or nil.
func (h *history) get(stepID string) *state.Step { return h.steps[stepID] }

// put records rec, just committed or found.
func (h *history) put(rec *state.Step) {
	h.steps[rec.StepID] = rec
	h.upto = max(h.upto, rec.Rev)
}
