package jetflow

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// RerunOptions says what Rerun starts.
type RerunOptions struct {
	// From is the source run's first step to run again: a step name (its
	// first call), or a step ID of the run (a later call of a step in a
	// loop, "<run-id>.<name>.<n>"). Empty: where the run stopped, the
	// step that failed (its last committed step, when that holds an
	// error), else the first step after its last committed one.
	From string
	// RunID is the new run's ID. Empty: RerunID(source run ID, the From
	// step's ID), so that a repeated Rerun of the same step lands on the
	// same run; name another ID to rerun the same step once more.
	RunID string
	// DryRun computes the plan and starts nothing.
	DryRun bool
	// Source names who asked, for the audits (default: the client's
	// Name).
	Source string
}

// RerunPlan is what a rerun takes from its source and what it runs
// again. Its JSON encoding is what the producer's rerun --output json
// prints.
type RerunPlan struct {
	// SourceRunID and SourceGeneration name the run rerun.
	SourceRunID      string `json:"source_run_id"`
	SourceGeneration int    `json:"source_generation,omitempty"`
	// From is the source's step ID of the first step run again; empty
	// for a rerun from after the source's last committed step.
	From string `json:"from"`
	// RunID is the rerun's run ID.
	RunID string `json:"run_id"`
	// Kept are the source's records the rerun takes as committed, under
	// its own step IDs: its steps before From (with their results, and
	// any failure a step committed), every patch marker, and every event
	// delivered to the source (the rerun's waits receive them again).
	Kept []StepRecord `json:"kept"`
	// Again are the source's steps from From on, in call order: they run
	// again, under the rerun's step IDs (new Idempotency-Keys: an
	// external call there happens again unless its step uses a task key,
	// WithTaskKey, whose result is still cached). What the code calls
	// after them runs too.
	Again []StepRecord `json:"again"`
}

// RerunResult is what Rerun did: the plan, and the start of the new run
// (nil on a dry run).
type RerunResult struct {
	RerunPlan
	Start *StartResult `json:"start,omitempty"`
}

// Rerun starts a new run of the ended run runID's workflow with its input
// that takes the run's committed steps before one step (opts.From) as
// committed and runs that step and everything after it again, with the
// workflow's code the workers run now: after an outage or a fix, the
// failed runs go on from where they failed without repeating what
// succeeded. The new run has a run ID of its own (opts.RunID, by default
// RerunID), is admitted as any start (a repeat call gets OutcomeExisting
// and starts nothing), links to its source (Run.RerunOf), and the source
// lists it (Run.Reruns).
//
// The steps run again get the new run's step IDs, so an external API
// called with the step ID as Idempotency-Key sees a new key: that is what
// a rerun is for. The kept steps never run again.
//
// A run that has not ended is ErrRunNotEnded (cancel it first), an
// unknown one ErrRunNotFound, a step it never reached ErrStepNotReached.
// The source's records must still be kept when a worker takes the new run
// up (within the source's retention); if they are gone, the rerun fails
// with ErrRerunSource and runs nothing.
//
// It writes the runs bucket and the source's audit, which needs the NATS
// user jetflow_operator under the least-privilege profile.
func (c *Client) Rerun(ctx context.Context, runID string, opts RerunOptions) (out RerunResult, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return RerunResult{}, err
	}
	if opts.RunID != "" {
		if err := state.ValidateRunID(opts.RunID); err != nil {
			return RerunResult{}, err
		}
	}
	if err := state.ValidateSource(opts.Source); err != nil {
		return RerunResult{}, err
	}
	src, _, err := c.runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return RerunResult{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return RerunResult{}, err
	}
	if !src.Status.Terminal() {
		return RerunResult{}, fmt.Errorf("%w: run %s is %s", ErrRunNotEnded, runID, src.Status)
	}
	plan, link, err := c.rerunPlan(ctx, src, opts)
	if err != nil {
		return RerunResult{}, err
	}
	out.RerunPlan = plan
	if opts.DryRun {
		return out, nil
	}
	source := cmp.Or(opts.Source, c.cfg.Name)
	res, err := c.admit.Admit(ctx, dedupe.Request{
		RunID: plan.RunID, Workflow: src.Workflow, Input: src.Input, Source: source,
		Retention: src.Retention, Attributes: src.Attributes, Rerun: link,
	})
	if err != nil {
		return RerunResult{}, err
	}
	start := StartResult{RunID: res.Run.RunID, Workflow: res.Run.Workflow, Outcome: outcome(res.Outcome),
		Status: RunStatus(res.Run.Status), Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry,
		Generation: res.Run.Generation, generationKnown: true}
	out.Start = &start
	if l := res.Run.Rerun; l != nil && l.RunID == link.RunID && l.Generation == link.Generation {
		// The source lists its rerun: written by the call that created it,
		// and by a repeat that finds it missing (its creator died first).
		if err := c.listRerun(ctx, res.Run, source); err != nil {
			return out, fmt.Errorf("jetflow: rerun %s started, but the audit of %s does not list it yet (call again): %w", plan.RunID, runID, err)
		}
	}
	return out, nil
}

// rerunPlan reads the source run src's records and decides what a rerun
// of it from opts.From takes and runs again.
func (c *Client) rerunPlan(ctx context.Context, src state.Run, opts RerunOptions) (RerunPlan, *state.RerunLink, error) {
	identity := state.RunIdentity(src.RunID, src.Generation)
	recs, err := workflow.ReadRerunSource(ctx, c.assets, identity)
	if err != nil {
		return RerunPlan{}, nil, fmt.Errorf("jetflow: %w", err)
	}
	from, before, err := c.rerunPoint(ctx, recs, identity, opts.From)
	if err != nil {
		return RerunPlan{}, nil, err
	}
	kept := workflow.RerunKept(recs, before)
	plan := RerunPlan{SourceRunID: src.RunID, SourceGeneration: src.Generation, From: from,
		RunID: cmp.Or(opts.RunID, RerunID(src.RunID, from)), Kept: []StepRecord{}, Again: []StepRecord{}}
	if plan.RunID == src.RunID {
		return RerunPlan{}, nil, fmt.Errorf("%w: a rerun needs a run ID of its own, not its source's %s", ErrInvalidRunID, src.RunID)
	}
	for _, r := range kept {
		plan.Kept = append(plan.Kept, toStepRecord(r.Step))
	}
	for _, r := range recs {
		if r.Place >= before && r.Step.EventID == "" && r.Step.Kind != state.StepPatch {
			plan.Again = append(plan.Again, toStepRecord(r.Step))
		}
	}
	link := &state.RerunLink{RunID: src.RunID, Generation: src.Generation, From: from, Before: before, Records: len(kept)}
	return plan, link, nil
}

// rerunPoint finds the step a rerun starts from (its step ID) and its
// place in the source's call order. from is a step name, a step ID of the
// source generation identity, or empty (where the run stopped).
func (c *Client) rerunPoint(ctx context.Context, recs []workflow.RerunRecord, identity, from string) (string, int, error) {
	if from == "" {
		last := -1
		for _, r := range recs {
			if r.Place > last {
				last = r.Place
			}
		}
		if i := slices.IndexFunc(recs, func(r workflow.RerunRecord) bool { return r.Place == last }); last >= 0 && recs[i].Step.Error != nil {
			return recs[i].Step.StepID, last, nil
		}
		return "", last + 1, nil // the step after the last committed one: not named by any record
	}
	stepID := from
	if !strings.Contains(from, ".") {
		if err := state.ValidateName(from); err != nil {
			return "", 0, fmt.Errorf("%w: %w", ErrStepNotReached, err)
		}
		stepID = state.StepID(identity, from, 0)
	}
	if i := slices.IndexFunc(recs, func(r workflow.RerunRecord) bool { return r.Step.StepID == stepID }); i >= 0 {
		if recs[i].Place < 0 {
			return "", 0, fmt.Errorf("%w: %s holds an event the run never waited for", ErrStepNotReached, stepID)
		}
		return stepID, recs[i].Place, nil
	}
	// Begun and never committed: a wait the run ended in.
	v, _, err := c.assets.Attempts.Get(ctx, state.WaitKey(stepID))
	if errors.Is(err, jetstream.ErrNotFound) {
		return "", 0, fmt.Errorf("%w: run generation %s has no step %s", ErrStepNotReached, identity, stepID)
	}
	if err != nil {
		return "", 0, fmt.Errorf("jetflow: read the wait of %s: %w", stepID, err)
	}
	w, err := state.DecodeWait(v)
	if err != nil {
		return "", 0, err
	}
	return stepID, w.Seq, nil
}

// listRerun adds the rerun run to its source's audit, unless it lists it.
func (c *Client) listRerun(ctx context.Context, run state.Run, source string) error {
	return c.runs.RecordRerun(ctx, run.Rerun.RunID, state.RerunEntry{
		At: time.Now().UTC(), RunID: run.RunID, Generation: run.Generation, From: run.Rerun.From, Source: source})
}

// RerunID is the run ID Rerun gives by default to the rerun of the run
// runID from its step stepID: <run-id>-rerun-<name>-<n> (<run-id>-rerun
// for a rerun from after the run's last committed step, stepID ""), or,
// when that is longer than a run ID may be, the run ID's first 64 bytes,
// -rerun- and a hash of the whole.
func RerunID(runID, stepID string) string {
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
