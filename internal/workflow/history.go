package workflow

import (
	"cmp"
	"context"
	"fmt"
	"slices"

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
	// places are the placed records (placed) by their place (Seq): what
	// a replay compares the body's calls with (divergence.go).
	places map[int]*state.Step
	// awaited are the steps the run's parked lease says its body waits
	// for and that are not committed, by place; awaitedAt is the place of
	// each by step ID (awaiting). A replay compares its calls with them as
	// with the records.
	awaited   map[int]awaitedStep
	awaitedAt map[string]int
	// last is the highest place the records and the awaited steps hold
	// (-1: none).
	last int
	// lease is the lease record and its revision (nil, 0: none).
	lease    *state.Lease
	leaseRev uint64
	// upto is the highest revision of the step records known (0: none):
	// a branch task the holder publishes reads the run's records as they
	// stood there, which holds every record the body's replay needs to
	// reach the branch (state.Task.Upto).
	upto uint64
}

func newHistory() *history {
	return &history{steps: make(map[string]*state.Step), places: make(map[int]*state.Step), last: -1}
}

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
	h := &history{steps: make(map[string]*state.Step, len(entries)), places: make(map[int]*state.Step, len(entries)), last: -1}
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

// at returns the placed record at place seq, or nil.
func (h *history) at(seq int) *state.Step { return h.places[seq] }

// put records rec, just committed or found.
func (h *history) put(rec *state.Step) {
	if old := h.steps[rec.StepID]; old != nil && placed(old) && h.places[old.Seq] == old {
		delete(h.places, old.Seq)
	}
	h.steps[rec.StepID] = rec
	if placed(rec) {
		h.places[rec.Seq] = rec
		h.last = max(h.last, rec.Seq)
	}
	h.upto = max(h.upto, rec.Rev)
}

// awaitedStep is a step a parked lease says the body waits for.
type awaitedStep struct {
	id string
	// inline: a sequential step whose retry waits for its timer; else a
	// branch, a wait or a child run the await began.
	inline bool
}

// awaiting adds to h what the lease record l (the one the delivery took
// the run from) says the body waited for at its last park: the steps of
// its Waits not committed, at their places (a record written after the
// park, by a holder or a delivery handed back, keeps them), and gives an
// event committed into one of them the place of its wait. A record
// without places (written by an earlier version) adds nothing.
func (h *history) awaiting(l state.Lease) {
	if len(l.BegunPlaces) == len(l.Begun) {
		for i, id := range l.Begun {
			h.await(id, l.BegunPlaces[i], false)
		}
	}
	if len(l.Places) != len(l.Waits) {
		return
	}
	for i, id := range l.Waits {
		if rec := h.steps[id]; rec != nil {
			if rec.EventID != "" && h.places[l.Places[i]] == nil {
				// An event its sender committed into a wait the run
				// waited for: its place is the wait's, which the record
				// does not carry.
				h.places[l.Places[i]] = rec
				h.last = max(h.last, l.Places[i])
			}
			continue
		}
		h.await(id, l.Places[i], !l.Began)
	}
}

// await records step id, not committed, as one the run waits for at place
// seq (inline: a sequential step's retry).
func (h *history) await(id string, seq int, inline bool) {
	if h.steps[id] != nil {
		return
	}
	if h.awaited == nil {
		h.awaited, h.awaitedAt = make(map[int]awaitedStep), make(map[string]int)
	}
	h.awaited[seq] = awaitedStep{id: id, inline: inline}
	h.awaitedAt[id] = seq
	h.last = max(h.last, seq)
}

// waive forgets what an operator told the run to go on without
// (state.Run.Waived): the record of each step at the revision it had then
// (revs; 0: none was committed) and the step's place among what the run
// waits for. A replay neither returns nor compares them; a record the code
// committed under the step's ID after the waiver counts.
func (h *history) waive(ids []string, revs map[string]uint64) {
	for _, id := range ids {
		if seq, ok := h.awaitedAt[id]; ok {
			delete(h.awaited, seq)
			delete(h.awaitedAt, id)
		}
		old := h.steps[id]
		if old == nil || revs[id] == 0 || old.Rev != revs[id] {
			continue
		}
		if h.places[old.Seq] == old {
			delete(h.places, old.Seq)
		}
		delete(h.steps, id)
	}
}

// checkRun is the history as a replay check replays it (Check): the
// records in commit order (their revisions), with the run's workflow,
// identity and input.
func (h *history) checkRun(run state.Run) CheckRun {
	steps := make([]state.Step, 0, len(h.steps))
	for _, rec := range h.steps {
		steps = append(steps, *rec)
	}
	slices.SortFunc(steps, func(a, b state.Step) int { return cmp.Compare(a.Rev, b.Rev) })
	return CheckRun{Workflow: run.Workflow, RunID: run.RunID, Generation: run.Generation, Input: run.Input, Steps: steps}
}

// compared is the history as Compare compares it.
func (h *history) compared() []HistoryStep {
	steps := make([]HistoryStep, 0, len(h.steps))
	for _, rec := range h.steps {
		steps = append(steps, HistoryStepOf(rec))
	}
	slices.SortFunc(steps, func(a, b HistoryStep) int { return cmp.Compare(a.Seq, b.Seq) })
	return steps
}
