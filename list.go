package jetflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// ListOptions selects a page of runs for ListRuns.
type ListOptions struct {
	// Workflow keeps only runs of this workflow ("" for all).
	Workflow string
	// Status keeps only runs in this state ("" for all).
	Status RunStatus
	// RunIDPrefix keeps only runs whose ID starts with it ("" for all); a
	// whole run ID finds that run.
	RunIDPrefix string
	// Since and Until keep only runs whose last status change (start,
	// start again, end) is in [Since, Until); zero for open.
	Since, Until time.Time
	// After is the cursor: RunPage.Next of the previous page ("" for the
	// first page). It is opaque.
	After string
	// Limit is the most runs a page holds (default 50, at most MaxListLimit).
	Limit int
}

// Default and largest page sizes of ListRuns.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// RunPage is one page of ListRuns. Its JSON encoding is the page as the
// HTTP API and the producer's --output json show it; they send an empty
// page's Runs as [], never null.
type RunPage struct {
	// Runs, newest first.
	Runs []Run `json:"runs"`
	// Next is the cursor of the next page (ListOptions.After), "" when
	// this page is the last.
	Next string `json:"next_cursor,omitempty"`
}

// ListRuns returns the runs whose records are kept (within retention),
// newest first by the time of their last status change — a running run
// by when it started (or was started again), an ended run by when it
// ended — filtered by workflow, status, run ID prefix and time, one page
// at a time.
//
// It reads the run index, so a page costs about the same with a thousand
// or a million kept runs; each run of the page is then read from its
// record, so what a page shows is the record, never a stale index entry.
// A page may hold fewer than Limit runs while more follow (Next is set):
// an entry whose run changed or expired since it was written is left out
// and repaired. A run that changes status while a walk is in progress
// moves to the top of the list: the walk may miss it, never show it twice
// on one page.
func (c *Client) ListRuns(ctx context.Context, opts ListOptions) (_ RunPage, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	q, err := opts.query()
	if err != nil {
		return RunPage{}, err
	}
	page, err := c.runs.Index().Page(ctx, q)
	if errors.Is(err, runindex.ErrMissing) {
		if err := c.rebuildIndex(ctx); err != nil {
			return RunPage{}, err
		}
		page, err = c.runs.Index().Page(ctx, q)
	}
	if err != nil {
		return RunPage{}, err
	}
	out := RunPage{Runs: []Run{}}
	if page.Next != 0 {
		out.Next = runindex.EncodeCursor(page.Next)
	}
	listed := make([]Run, len(page.Entries))
	kept := make([]bool, len(page.Entries))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listReaders)
	for i, e := range page.Entries {
		g.Go(func() (err error) {
			listed[i], kept[i], err = c.listed(gctx, e)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return RunPage{}, err
	}
	for i, run := range listed {
		if kept[i] {
			out.Runs = append(out.Runs, run)
		}
	}
	return out, nil
}

// listReaders is how many runs of a page ListRuns reads at once.
const listReaders = 16

// listed reads the run of index entry e; ok is false when the entry no
// longer stands for the run's record (the record changed or expired), in
// which case listed repairs the index (runs.Store.Repair). A repair that fails (a producer
// may not write the index) goes to the store's IndexFailed: the page is
// right either way.
func (c *Client) listed(ctx context.Context, e runindex.Entry) (Run, bool, error) {
	r, _, err := c.runs.Get(ctx, e.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		if err := c.runs.Unindex(ctx, e.RunID); err != nil {
			c.runs.IndexFailed(e.RunID, err)
		}
		return Run{}, false, nil
	}
	if errors.Is(err, state.ErrCorrupt) {
		return Run{}, false, fmt.Errorf("run %s: %w", e.RunID, err)
	}
	if err != nil {
		return Run{}, false, err
	}
	if !e.Matches(r) {
		if err := c.runs.Repair(ctx, e, r); err != nil {
			c.runs.IndexFailed(e.RunID, err)
		}
		return Run{}, false, nil
	}
	run, err := c.toRun(ctx, r)
	return run, err == nil, err
}

// rebuildIndex makes the run index stream again after it went missing and
// fills it from the run records.
func (c *Client) rebuildIndex(ctx context.Context) error {
	if err := c.assets.EnsureIndexStream(ctx); err != nil {
		return err
	}
	_, err := c.runs.EnsureIndex(ctx)
	return err
}

// RunCounts is how many kept runs are in each state.
type RunCounts struct {
	Running   int64 `json:"running"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	Cancelled int64 `json:"cancelled"`
}

// CountRuns counts the kept runs of workflow ("" for all) in each state,
// from the run index: four requests, which the server answers from its
// subject index in time that grows with the runs counted (about 70 ms for
// 200,000 on two cores, bench/RESULTS.md; a page of ListRuns does not
// grow so). The counts are the index's, so a run whose entry is being
// written may be counted under its former state for a moment.
func (c *Client) CountRuns(ctx context.Context, workflow string) (_ RunCounts, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if workflow != "" {
		if err := state.ValidateName(workflow); err != nil {
			return RunCounts{}, fmt.Errorf("%w: %w", ErrInvalidListOptions, err)
		}
	}
	n, err := c.runs.Index().Count(ctx, workflow)
	if errors.Is(err, runindex.ErrMissing) {
		if err := c.rebuildIndex(ctx); err != nil {
			return RunCounts{}, err
		}
		n, err = c.runs.Index().Count(ctx, workflow)
	}
	if err != nil {
		return RunCounts{}, err
	}
	return RunCounts{Running: n[state.StatusRunning], Completed: n[state.StatusCompleted], Failed: n[state.StatusFailed], Cancelled: n[state.StatusCancelled]}, nil
}

// query checks o and turns it into an index query.
func (o ListOptions) query() (runindex.Query, error) {
	bad := func(format string, args ...any) (runindex.Query, error) {
		return runindex.Query{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidListOptions}, args...)...)
	}
	switch {
	case o.Workflow != "" && state.ValidateName(o.Workflow) != nil:
		return bad("%w", state.ValidateName(o.Workflow))
	case o.Status != "" && !state.Status(o.Status).Valid():
		return bad("status %q: want running, completed, failed or cancelled", o.Status)
	case o.RunIDPrefix != "" && state.ValidateRunID(o.RunIDPrefix) != nil:
		return bad("run ID prefix: %w", state.ValidateRunID(o.RunIDPrefix))
	case !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until):
		return bad("since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return bad("limit %d: want 1..%d (0 for %d)", o.Limit, MaxListLimit, DefaultListLimit)
	}
	before, err := runindex.ParseCursor(o.After)
	if err != nil {
		return bad("%w", err)
	}
	limit := o.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	return runindex.Query{Status: state.Status(o.Status), Workflow: o.Workflow, Prefix: o.RunIDPrefix,
		Since: o.Since, Until: o.Until, Before: before, Limit: limit}, nil
}
