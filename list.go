package jetflow

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// ListOptions selects a page of runs for ListRuns.
type ListOptions struct {
	// Workflow keeps only runs of this workflow ("" for all).
	Workflow string
	// Status keeps only runs in this state ("" for all).
	Status RunStatus
	// After is the cursor: the page starts after this run ID (RunPage.Next
	// of the previous page; "" for the first page).
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
	// Runs in run ID order.
	Runs []Run `json:"runs"`
	// Next is the cursor of the next page (ListOptions.After), "" when
	// this page is the last.
	Next string `json:"next_cursor,omitempty"`
}

// ListRuns returns the runs whose records are kept (within retention), in
// run ID order, filtered by workflow and status, one page at a time. Pages
// are stable under concurrent starts: a run created while paging appears
// on a later page if its ID sorts after the cursor. A run whose record
// expires between the listing and the read is skipped.
//
// It reads every key of the runs bucket and then each run of the page
// (with its audit), so it is an operator's tool, not a query path: with a
// million kept runs a page costs about a second.
func (c *Client) ListRuns(ctx context.Context, opts ListOptions) (_ RunPage, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := opts.validate(); err != nil {
		return RunPage{}, err
	}
	limit := opts.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	keys, err := c.runs.Keys(ctx)
	if err != nil {
		return RunPage{}, err
	}
	start, _ := slices.BinarySearch(keys, opts.After)
	if start < len(keys) && keys[start] == opts.After {
		start++
	}
	var page RunPage
	for i := start; i < len(keys); i++ {
		if len(page.Runs) == limit {
			page.Next = page.Runs[limit-1].RunID
			break
		}
		r, _, err := c.runs.Get(ctx, keys[i])
		if errors.Is(err, runs.ErrNotFound) {
			continue // expired since the listing
		}
		if errors.Is(err, state.ErrCorrupt) {
			return RunPage{}, fmt.Errorf("run %s: %w", keys[i], err)
		}
		if err != nil {
			return RunPage{}, err
		}
		if (opts.Workflow != "" && r.Workflow != opts.Workflow) || (opts.Status != "" && RunStatus(r.Status) != opts.Status) {
			continue
		}
		run, err := c.toRun(ctx, r)
		if err != nil {
			return RunPage{}, err
		}
		page.Runs = append(page.Runs, run)
	}
	return page, nil
}

func (o ListOptions) validate() error {
	switch {
	case o.Workflow != "" && state.ValidateName(o.Workflow) != nil:
		return fmt.Errorf("%w: %w", ErrInvalidListOptions, state.ValidateName(o.Workflow))
	case o.Status != "" && !state.Status(o.Status).Valid():
		return fmt.Errorf("%w: status %q: want running, completed, failed or cancelled", ErrInvalidListOptions, o.Status)
	case o.After != "" && state.ValidateRunID(o.After) != nil:
		return fmt.Errorf("%w: cursor: %w", ErrInvalidListOptions, state.ValidateRunID(o.After))
	case o.Limit < 0 || o.Limit > MaxListLimit:
		return fmt.Errorf("%w: limit %d: want 1..%d (0 for %d)", ErrInvalidListOptions, o.Limit, MaxListLimit, DefaultListLimit)
	}
	return nil
}
