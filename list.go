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
	// Attributes keeps only runs started with every one of these
	// attributes (WithAttributes), equal in name and value (nil for all).
	// The page walks the run index's entries of one of them (the one
	// fewest runs have) and checks the others on each run's record, so a
	// page of several attributes may hold fewer runs while more follow.
	Attributes map[string]string
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
// ended — filtered by workflow, status, run ID prefix, time and
// attributes (WithAttributes), one page at a time.
//
// It reads the run index, so a page costs about the same with a thousand
// or a million kept runs; each run of the page is then read from its
// record, so what a page shows is the record, never a stale index entry.
// A page may hold fewer than Limit runs while more follow (Next is set):
// an entry whose run expired, or changed so that it no longer matches the
// filters, since it was written is left out, and the index repaired (see
// repairIndex). A run that changes status while a walk is in progress
// moves to the top of the list: the walk may miss it, never show it twice
// on one page.
func (c *Client) ListRuns(ctx context.Context, opts ListOptions) (_ RunPage, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	q, err := opts.query()
	if err != nil {
		return RunPage{}, err
	}
	var page runindex.Page
	err = c.readIndex(ctx, func() (err error) {
		page, err = c.runs.Index().Page(ctx, q)
		return err
	})
	if err != nil {
		return RunPage{}, err
	}
	out := RunPage{Runs: []Run{}}
	if page.Next != 0 {
		out.Next = runindex.EncodeCursor(page.Next)
	}
	listed := make([]listing, len(page.Entries))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listReaders)
	for i, e := range page.Entries {
		g.Go(func() (err error) {
			listed[i], err = c.listed(gctx, e, opts)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return RunPage{}, err
	}
	var stale []listing
	for _, l := range listed {
		if l.stale {
			stale = append(stale, l)
		}
		if l.show {
			out.Runs = append(out.Runs, l.run)
		}
	}
	c.repairIndex(ctx, stale)
	return out, nil
}

// listReaders is how many runs of a page ListRuns reads at once.
const listReaders = 16

// listing is what ListRuns found for one index entry: the run to show
// (show), and whether the entry is stale (it does not stand for the run's
// record, or there is no record), with the record to repair the index by
// (nil: none).
type listing struct {
	run    Run
	show   bool
	stale  bool
	entry  runindex.Entry
	record *state.Run
}

// listed reads the run of index entry e. A stale entry's run is still
// shown, as its record stands, when the record matches the page's
// filters: its writer is between the record and the entry, and the run
// would otherwise be missing from the list for that moment. (It may then
// show on two pages of a walk, at its new place and at its old one; never
// twice on one page: the index gives a run one entry per page.)
func (c *Client) listed(ctx context.Context, e runindex.Entry, opts ListOptions) (listing, error) {
	r, _, err := c.runs.Get(ctx, e.RunID)
	if errors.Is(err, runs.ErrNotFound) {
		return listing{stale: true, entry: e}, nil
	}
	if errors.Is(err, state.ErrCorrupt) {
		return listing{}, fmt.Errorf("run %s: %w", e.RunID, err)
	}
	if err != nil {
		return listing{}, err
	}
	l := listing{show: opts.selects(r)}
	if !e.Matches(r) || !e.StandsFor(r) {
		l = listing{stale: true, entry: e, record: &r, show: opts.selects(r)}
	}
	if l.show {
		l.run, err = c.toRun(ctx, r)
	}
	return l, err
}

// selects reports whether run passes o's status, workflow and attribute
// filters (the run ID prefix holds: the entry had the run's ID).
func (o ListOptions) selects(run state.Run) bool {
	return (o.Status == "" || RunStatus(run.Status) == o.Status) && (o.Workflow == "" || run.Workflow == o.Workflow) &&
		state.HasAttributes(run.Attributes, o.Attributes)
}

// repairIndex repairs the stale entries a page met (runs.Store.Repair).
// The page is right without it: a failure goes to the store's
// IndexFailed. A client whose NATS user may not write the index (a
// producer) is refused at once (the denial watch), says so once, and
// stops trying: workers and operators repair what they meet.
func (c *Client) repairIndex(ctx context.Context, stale []listing) {
	if len(stale) == 0 || c.noIndexRepair.Load() {
		return
	}
	wctx, stop := c.denials.watch(ctx, c.nc, indexWrites...)
	defer stop()
	for _, l := range stale {
		err := c.runs.Repair(wctx, l.entry, l.record)
		if cause := context.Cause(wctx); errors.Is(cause, ErrPermissionDenied) {
			c.noIndexRepair.Store(true)
			c.runs.IndexFailed(l.entry.RunID, fmt.Errorf("this client's NATS user may not repair the run index (workers and operators do): %w", cause))
			return
		}
		if err != nil {
			c.runs.IndexFailed(l.entry.RunID, err)
		}
	}
}

// indexWrites are the subjects a repair of the run index publishes to.
var indexWrites = []string{"$JS.API.STREAM.PURGE." + jetstream.IndexStream, "jetflow.runindex."}

// readIndex runs read, a read of the run index, on a complete index: it
// first looks for the marker of a completed build (one direct get), as
// a read of an index being built would miss runs. When the stream is
// missing (deleted by hand) it makes it again; when no build has completed
// (the stream was just made again, here or by a worker's sweeper, which
// may be building it now) it builds it from the run records (builds may
// run at once), or, when this client's NATS user may not write the index
// (a producer), waits for a worker's build. A stream deleted between the
// check and the read is made again once more.
func (c *Client) readIndex(ctx context.Context, read func() error) error {
	for attempt := 1; ; attempt++ {
		built, err := c.runs.Index().Built(ctx)
		if errors.Is(err, runindex.ErrMissing) {
			built, err = false, c.assets.EnsureIndexStream(ctx)
		}
		if err == nil && !built {
			err = c.buildIndex(ctx)
		}
		if err == nil {
			err = read()
		}
		if !errors.Is(err, runindex.ErrMissing) || attempt == 2 {
			return err
		}
	}
}

// buildIndex builds the run index from the run records (runs.Store's
// EnsureIndex) or, when this client's user may not write the index, waits
// until a worker's build has completed, within ctx.
func (c *Client) buildIndex(ctx context.Context) error {
	if !c.noIndexRepair.Load() {
		wctx, stop := c.denials.watch(ctx, c.nc, indexWrites...)
		_, err := c.runs.EnsureIndex(wctx)
		stop()
		if !errors.Is(context.Cause(wctx), ErrPermissionDenied) {
			return err
		}
		c.noIndexRepair.Store(true)
	}
	wait := 20 * time.Millisecond
	for {
		built, err := c.runs.Index().Built(ctx)
		if err != nil || built {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the run index is being built by the workers: %w", ErrUnavailable, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// RunCounts is how many kept runs are in each state.
type RunCounts struct {
	Running   int64 `json:"running"`
	Blocked   int64 `json:"blocked"`
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
	var n runindex.Counts
	err = c.readIndex(ctx, func() (err error) {
		n, err = c.runs.Index().Count(ctx, workflow)
		return err
	})
	if err != nil {
		return RunCounts{}, err
	}
	return RunCounts{Running: n[state.StatusRunning], Blocked: n[state.StatusBlocked], Completed: n[state.StatusCompleted], Failed: n[state.StatusFailed], Cancelled: n[state.StatusCancelled]}, nil
}

// query checks o and turns it into an index query.
func (o ListOptions) query() (runindex.Query, error) {
	bad := func(format string, args ...any) (runindex.Query, error) {
		return runindex.Query{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidListOptions}, args...)...)
	}
	switch {
	case o.Workflow != "" && state.ValidateName(o.Workflow) != nil:
		return bad("%w", state.ValidateName(o.Workflow))
	case o.Status != "" && !state.ValidStatus(o.Status):
		return bad("status %q: want running, completed, failed or cancelled", o.Status)
	case o.RunIDPrefix != "" && state.ValidateRunID(o.RunIDPrefix) != nil:
		return bad("run ID prefix: %w", state.ValidateRunID(o.RunIDPrefix))
	case !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until):
		return bad("since %s is not before until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339))
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return bad("limit %d: want 1..%d (0 for %d)", o.Limit, MaxListLimit, DefaultListLimit)
	}
	if err := state.ValidateAttributes(o.Attributes); err != nil {
		return bad("%w", err)
	}
	before, err := runindex.ParseCursor(o.After)
	if err != nil {
		return bad("%w", err)
	}
	limit := o.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	q := runindex.Query{Status: state.Status(o.Status), Workflow: o.Workflow, Prefix: o.RunIDPrefix,
		Since: o.Since, Until: o.Until, Before: before, Limit: limit}
	q.Attributes = o.Attributes
	return q, nil
}
