package workflow

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// A rerun is a new run (its own run ID, admitted as any start) of a run
// that ended, which takes the source's committed records before one of
// its steps as committed and runs the rest again, under its own step IDs.
// The run record says so (state.Run.Rerun); every holder of such a run
// makes sure, before the body replays, that those records are committed
// under the run's own step IDs (takeRerunPrefix). The copies are the
// source's records with the run's step ID and run ID, written
// create-if-absent: every holder writes the same bytes, so a holder that
// died half-way leaves nothing that a later one would write differently.

// Refusals of a rerun: nothing is started.
var (
	ErrRunNotEnded    = jetflowtype.ErrRunNotEnded
	ErrStepNotReached = jetflowtype.ErrStepNotReached
)

// RerunPlan is what a rerun of Source from its step From (place Before
// in its call order) takes as committed (Kept) and what of it runs again
// (Again: the source's records from there on, waits and steps), under run
// ID RunID; Link is what the rerun's record carries.
type RerunPlan struct {
	Source state.Run
	From   string
	RunID  string
	Kept   []RerunRecord
	Again  []RerunRecord
	Link   *state.RerunLink
}

// PlanRerun plans the rerun of the ended run runID from its step from (a
// step name for its first call, a step ID of the run, or "" for where it
// stopped: the step it failed at when its last placed record holds a
// failure, else the place after its last placed record) under run ID
// rerunID ("": DefaultRerunID). It reads the run's record and records and
// writes nothing: a repeat call plans the same. A run that is not there is
// ErrRunNotFound, one not ended ErrRunNotEnded, a step it never reached
// ErrStepNotReached, a rerun ID that is the run's own state.ErrInvalidRunID.
func PlanRerun(ctx context.Context, assets *jetstream.Assets, store *runs.Store, runID, from, rerunID string) (RerunPlan, error) {
	src, _, err := store.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return RerunPlan{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return RerunPlan{}, err
	}
	if !src.Status.Terminal() {
		return RerunPlan{}, fmt.Errorf("%w: run %s is %s", ErrRunNotEnded, runID, src.Status)
	}
	identity := state.RunIdentity(src.RunID, src.Generation)
	recs, err := ReadRerunSource(ctx, assets, identity)
	if err != nil {
		return RerunPlan{}, err
	}
	fromID, before, err := rerunPoint(ctx, assets, recs, identity, from)
	if err != nil {
		return RerunPlan{}, err
	}
	plan := RerunPlan{Source: src, From: fromID, RunID: cmp.Or(rerunID, DefaultRerunID(src.RunID, fromID)), Kept: RerunKept(recs, before)}
	if plan.RunID == src.RunID {
		return RerunPlan{}, fmt.Errorf("%w: a rerun needs a run ID of its own, not its source's %s", state.ErrInvalidRunID, src.RunID)
	}
	for _, r := range recs {
		if r.Place >= before && r.Step.EventID == "" && r.Step.Kind != state.StepPatch {
			plan.Again = append(plan.Again, r)
		}
	}
	plan.Link = &state.RerunLink{RunID: src.RunID, Generation: src.Generation, From: fromID, Before: before, Records: len(plan.Kept)}
	return plan, nil
}

// rerunPoint finds the step a rerun starts from (its step ID, "" for the
// place after the last placed record) and its place in the source's call
// order, among recs, the records of the source generation identity.
func rerunPoint(ctx context.Context, assets *jetstream.Assets, recs []RerunRecord, identity, from string) (string, int, error) {
	if from == "" {
		last := -1
		for _, r := range recs {
			last = max(last, r.Place)
		}
		if i := slices.IndexFunc(recs, func(r RerunRecord) bool { return r.Place == last }); last >= 0 && recs[i].Step.Error != nil {
			return recs[i].Step.StepID, last, nil
		}
		return "", last + 1, nil
	}
	stepID := from
	if !strings.Contains(from, ".") {
		if err := state.ValidateName(from); err != nil {
			return "", 0, fmt.Errorf("%w: %w", ErrStepNotReached, err)
		}
		stepID = state.StepID(identity, from, 0)
	}
	if i := slices.IndexFunc(recs, func(r RerunRecord) bool { return r.Step.StepID == stepID }); i >= 0 {
		if recs[i].Place < 0 {
			return "", 0, fmt.Errorf("%w: %s holds an event the run never waited for", ErrStepNotReached, stepID)
		}
		return stepID, recs[i].Place, nil
	}
	// Begun and never committed: a wait the run ended in.
	v, _, err := assets.Attempts.Get(ctx, state.WaitKey(stepID))
	if errors.Is(err, jetstream.ErrNotFound) {
		return "", 0, fmt.Errorf("%w: run generation %s has no step %s", ErrStepNotReached, identity, stepID)
	}
	if err != nil {
		return "", 0, fmt.Errorf("read the wait of %s: %w", stepID, err)
	}
	w, err := state.DecodeWait(v)
	if err != nil {
		return "", 0, err
	}
	return stepID, w.Seq, nil
}

// DefaultRerunID is the run ID a rerun of the run runID from its step
// stepID gets unless it is given one: <run-id>-rerun-<name>-<n>
// (<run-id>-rerun for a rerun from after the run's last committed step,
// stepID ""), or, when that is longer than a run ID may be, the run ID's
// first 64 bytes, -rerun- and a hash of the whole.
func DefaultRerunID(runID, stepID string) string {
	id := runID + "-rerun"
	if stepID != "" {
		id += "-" + state.StepName(stepID) + "-" + strconv.Itoa(state.Occurrence(stepID))
	}
	if len(id) <= state.MaxRunIDLen && state.ValidateRunID(id) == nil {
		return id
	}
	sum := sha256.Sum256([]byte(runID + "\x00" + stepID))
	return runID[:min(len(runID), 64)] + "-rerun-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// ListRerun adds run, a rerun, to its source's audit (state.Audit.Reruns)
// unless it lists it already: a repeat, or a race, adds nothing.
func ListRerun(ctx context.Context, store *runs.Store, run state.Run, source string, now time.Time) error {
	return store.RecordRerun(ctx, run.Rerun.RunID, state.RerunEntry{
		At: now.UTC(), RunID: run.RunID, Generation: run.Generation, From: run.Rerun.From, Source: source})
}

// ErrRerunSource fails a rerun whose source no longer holds the records
// the rerun was admitted with (its retention passed): the rerun would run
// them again.
var ErrRerunSource = errors.New("jetflow: the rerun's source records are gone")

// RerunRecord is one committed record of a rerun's source: the step as
// decoded, its stored bytes, the bytes of its wait record (nil: none), and
// its place in call order (-1: none, a patch marker or an event whose wait
// was never reached).
type RerunRecord struct {
	Step  state.KeyedStep
	Raw   []byte
	Wait  []byte
	Place int
}

// ReadRerunSource reads the committed records of the run generation
// identity, with their places, in call order (unplaced ones last, in
// commit order).
func ReadRerunSource(ctx context.Context, assets *jetstream.Assets, identity string) ([]RerunRecord, error) {
	entries, err := assets.Steps.Matching(ctx, identity+".>")
	if err != nil {
		return nil, fmt.Errorf("read the records of %s: %w", identity, err)
	}
	marks, err := assets.Attempts.Matching(ctx, state.WaitKeys(identity))
	if err != nil {
		return nil, fmt.Errorf("read the waits of %s: %w", identity, err)
	}
	waits := make(map[string]jetstream.Entry, len(marks))
	for _, m := range marks {
		waits[m.Key] = m
	}
	var out []RerunRecord
	for _, e := range entries {
		if state.IsLeaseKey(e.Key) {
			continue
		}
		s, err := state.DecodeKeyedStep(e.Value)
		if err != nil {
			return nil, fmt.Errorf("record %s: %w", e.Key, err)
		}
		s.Rev = e.Rev
		r := RerunRecord{Step: s, Raw: e.Value, Place: -1}
		if placed(&s.Step) {
			r.Place = s.Seq
		}
		if m, ok := waits[state.WaitKey(s.StepID)]; ok {
			w, err := state.DecodeWait(m.Value)
			if err != nil {
				return nil, fmt.Errorf("wait %s: %w", m.Key, err)
			}
			r.Wait, r.Place = m.Value, w.Seq
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b RerunRecord) int {
		if (a.Place < 0) != (b.Place < 0) {
			return cmp.Compare(b.Place, a.Place) // placed first
		}
		if a.Place != b.Place {
			return cmp.Compare(a.Place, b.Place)
		}
		return cmp.Compare(a.Step.Rev, b.Step.Rev)
	})
	return out, nil
}

// RerunKept is what a rerun from the step at place before takes from its
// source's records recs as committed: every record placed before it with
// its wait record, every patch marker (the way the source took at each
// patch point it passed), and every event delivered to the source (the
// rerun's waits receive them again, as a redelivered event would; the
// wait's own record is not taken past before, so the wait begins anew).
// The rest runs again.
func RerunKept(recs []RerunRecord, before int) []RerunRecord {
	var out []RerunRecord
	for _, r := range recs {
		switch {
		case r.Place >= 0 && r.Place < before:
			out = append(out, r)
		case r.Step.Kind == state.StepPatch, r.Step.EventID != "":
			r.Wait = nil
			out = append(out, r)
		}
	}
	return out
}

// takeRerunPrefix commits, as the run's own, the records of its rerun
// source that it takes (RerunKept), unless they are in h already, adds them
// to h, and then notes in the attempts bucket that they are all there
// (RerunCopiedKey): a later holder reads that one key and nothing of the
// source. It does nothing for a run that is not a rerun. A source that
// holds fewer of them than the run was admitted with is ErrRerunSource.
func (e *Executor) takeRerunPrefix(d *delivery, h *history) error {
	link := d.run.Rerun
	if link == nil {
		return nil
	}
	identity := d.identity()
	done := state.RerunCopiedKey(identity)
	_, _, err := e.cfg.Assets.Attempts.Get(d.nctx, done)
	if err == nil || !errors.Is(err, jetstream.ErrNotFound) {
		return err // copied before (nil), or the read failed
	}
	src, err := ReadRerunSource(d.nctx, e.cfg.Assets, state.RunIdentity(link.RunID, link.Generation))
	if err != nil {
		return err
	}
	kept := RerunKept(src, link.Before)
	if len(kept) != link.Records {
		return fmt.Errorf("%w: run %s (generation %d) holds %d of the %d records this rerun takes from before %s",
			ErrRerunSource, link.RunID, link.Generation, len(kept), link.Records, cmp.Or(link.From, "its end"))
	}
	for _, r := range kept {
		id := state.StepID(identity, r.Step.Name, state.Occurrence(r.Step.StepID))
		if h.get(id) != nil {
			continue
		}
		rec, err := e.copyRecord(d, r, id)
		if err != nil {
			return err
		}
		h.put(rec)
	}
	if _, err := e.cfg.Assets.Attempts.Create(d.nctx, done, []byte(`{"v":1}`)); err != nil && !errors.Is(err, jetstream.ErrExists) {
		return fmt.Errorf("note the rerun's records copied: %w", err)
	}
	return nil
}

// copyRecord commits the source record r under step ID id of d's run,
// with its wait record if it has one, create-if-absent; a record written
// before (by an earlier holder) is read back. It returns the record as
// stored.
func (e *Executor) copyRecord(d *delivery, r RerunRecord, id string) (*state.Step, error) {
	if r.Wait != nil {
		b, err := rekey(r.Wait, map[string]string{"step_id": id})
		if err != nil {
			return nil, err
		}
		if _, err := e.cfg.Assets.Attempts.Create(d.nctx, state.WaitKey(id), b); err != nil && !errors.Is(err, jetstream.ErrExists) {
			return nil, fmt.Errorf("copy the wait of %s: %w", r.Step.StepID, err)
		}
	}
	b, err := rekey(r.Raw, map[string]string{"step_id": id, "run_id": d.run.RunID})
	if err != nil {
		return nil, err
	}
	rev, err := e.cfg.Assets.Steps.Create(d.nctx, id, b)
	if errors.Is(err, jetstream.ErrExists) {
		b, rev, err = e.cfg.Assets.Steps.Get(d.nctx, id)
	}
	if err != nil {
		return nil, fmt.Errorf("copy %s as %s: %w", r.Step.StepID, id, err)
	}
	rec, err := state.DecodeStep(b)
	if err != nil {
		return nil, fmt.Errorf("copy of %s: %w", r.Step.StepID, err)
	}
	rec.Rev = rev
	return &rec, nil
}

// rekey is the JSON object b with the string fields named in set replaced,
// every other field kept as it is.
func rekey(b []byte, set map[string]string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, fmt.Errorf("%w: %w", state.ErrCorrupt, err)
	}
	for k, v := range set {
		q, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		fields[k] = q
	}
	return json.Marshal(fields)
}
