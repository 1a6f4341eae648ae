package jetflow

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/startproto"
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
// Rerun only once every worker runs this version of jetflow: a worker of
// an earlier version runs a rerun it takes up as an ordinary run, and the
// kept steps run again (the engine does not check this yet).
//
// A run that has not ended is ErrRunNotEnded (cancel it first), an
// unknown one ErrRunNotFound, a step it never reached ErrStepNotReached.
// The source's records must still be kept when a worker takes the new run
// up (within the source's retention); if they are gone, the rerun fails
// with ErrRerunSource and runs nothing.
//
// A client with ClientConfig.StartByRequest has a worker that serves the
// workflow admit the rerun (it plans it again from the source's records
// and lists it in the source's audit), which the NATS user
// jetflow_producer may ask for; otherwise the rerun is admitted in this
// process, which writes the runs bucket, the run index, the task stream
// and the source's audit.
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
	plan, err := workflow.PlanRerun(ctx, c.assets, c.runs, runID, opts.From, opts.RunID)
	if err != nil {
		return RerunResult{}, err
	}
	out.RerunPlan = toRerunPlan(plan)
	if opts.DryRun {
		return out, nil
	}
	source := cmp.Or(opts.Source, c.cfg.Name)
	if c.cfg.StartByRequest {
		// A worker plans it again from the run's records and admits it.
		res, err := c.requestStart(ctx, plan.Source.Workflow, nil, startOptions{runID: plan.RunID, source: source,
			rerunOf: &startproto.RerunOf{RunID: runID, From: opts.From}})
		if err != nil {
			return RerunResult{}, err
		}
		out.Start = &res
		return out, nil
	}
	res, err := c.admit.Admit(ctx, dedupe.Request{
		RunID: plan.RunID, Workflow: plan.Source.Workflow, Input: plan.Source.Input, Source: source,
		Retention: plan.Source.Retention, Attributes: plan.Source.Attributes, Rerun: plan.Link,
	})
	if err != nil {
		return RerunResult{}, err
	}
	out.Start = &StartResult{RunID: res.Run.RunID, Workflow: res.Run.Workflow, Outcome: outcome(res.Outcome),
		Status: RunStatus(res.Run.Status), Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry,
		Generation: res.Run.Generation, generationKnown: true}
	if l := res.Run.Rerun; l != nil && l.RunID == plan.Link.RunID && l.Generation == plan.Link.Generation {
		// The source lists its rerun: written by the call that created it,
		// and by a repeat that finds it missing (its creator died first).
		if err := workflow.ListRerun(ctx, c.runs, res.Run, source, time.Now()); err != nil {
			return out, fmt.Errorf("jetflow: rerun %s started, but the audit of %s does not list it yet (call again): %w", plan.RunID, runID, err)
		}
	}
	return out, nil
}

// toRerunPlan is plan as Rerun returns it.
func toRerunPlan(plan workflow.RerunPlan) RerunPlan {
	out := RerunPlan{SourceRunID: plan.Source.RunID, SourceGeneration: plan.Source.Generation, From: plan.From,
		RunID: plan.RunID, Kept: []StepRecord{}, Again: []StepRecord{}}
	for _, r := range plan.Kept {
		out.Kept = append(out.Kept, toStepRecord(r.Step))
	}
	for _, r := range plan.Again {
		out.Again = append(out.Again, toStepRecord(r.Step))
	}
	return out
}

// RerunID is the run ID Rerun gives by default to the rerun of the run
// runID from its step stepID: <run-id>-rerun-<name>-<n> (<run-id>-rerun
// for a rerun from after the run's last committed step, stepID ""), or,
// when that is longer than a run ID may be, the run ID's first 64 bytes,
// -rerun- and a hash of the whole.
func RerunID(runID, stepID string) string { return workflow.DefaultRerunID(runID, stepID) }

// reruns plans and records the reruns a worker admits by request
// (startproto.Reruns), as Client.Rerun does in process.
type reruns struct {
	assets *jetstream.Assets
	runs   *runs.Store
}

func (r reruns) Plan(ctx context.Context, wf string, of startproto.RerunOf, rerunID string) (dedupe.Request, error) {
	plan, err := workflow.PlanRerun(ctx, r.assets, r.runs, of.RunID, of.From, rerunID)
	if err != nil {
		return dedupe.Request{}, err
	}
	if plan.Source.Workflow != wf {
		return dedupe.Request{}, fmt.Errorf("%w: run %s is a run of workflow %s, not %s", state.ErrCorrupt, of.RunID, plan.Source.Workflow, wf)
	}
	return dedupe.Request{RunID: plan.RunID, Workflow: wf, Input: plan.Source.Input, Attributes: plan.Source.Attributes, Rerun: plan.Link}, nil
}

func (r reruns) Listed(ctx context.Context, run state.Run, source string) error {
	return workflow.ListRerun(ctx, r.runs, run, source, time.Now())
}
