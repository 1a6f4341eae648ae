package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// A bulk operation reruns every ended run a filter selects, as a run of
// its own: the workflow BulkWorkflowName, under the run ID
// BulkRunID(operation ID). Its steps list the runs a page at a time and
// rerun each (Client.Rerun, default rerun IDs), so the operation has every
// guarantee a run has: started once under its ID however often it is
// asked for, each rerun a committed step (a worker killed in one reruns
// it, which finds the rerun it started: never two), its progress its
// committed steps, one rerun at a time per operation, paced when asked.
// Workers serve it when their registry holds BulkOperations.

// BulkWorkflowName is the workflow of bulk operations.
const BulkWorkflowName = "jetflow-bulk"

// bulkPageSize is how many runs one listing step of a bulk operation takes.
const bulkPageSize = 100

// BulkRunID is the run ID of the bulk operation opID: "bulk-" + opID.
func BulkRunID(opID string) string { return "bulk-" + opID }

// BulkFilter selects the ended runs a bulk operation acts on, as
// ListOptions does. Workflow is required; Status is one of the ended
// states (default failed). Until defaults to when the operation is
// started, so that runs the operation makes itself (reruns that fail)
// are never selected.
type BulkFilter struct {
	Workflow    string            `json:"workflow"`
	Status      RunStatus         `json:"status,omitempty"`
	RunIDPrefix string            `json:"run_id_prefix,omitempty"`
	Attributes  map[string]string `json:"attributes,omitempty"`
	Since       time.Time         `json:"since,omitzero"`
	Until       time.Time         `json:"until,omitzero"`
}

// BulkRerun is a bulk operation that reruns the runs Filter selects from
// their step From ("" for where each stopped; RerunOptions.From), at
// most PerSecond reruns a second (0: as fast as one at a time goes).
type BulkRerun struct {
	Filter    BulkFilter `json:"filter"`
	From      string     `json:"from,omitempty"`
	PerSecond float64    `json:"per_second,omitempty"`
}

// BulkItemError is a run a bulk operation could not act on, and why
// (it had not ended, it never reached the step, ...).
type BulkItemError struct {
	RunID string `json:"run_id"`
	Error string `json:"error"`
}

// BulkResult is what a bulk operation did: the runs it listed, the
// reruns it created, found existing (started before, by it or another
// caller) and could not start, with the first errors.
type BulkResult struct {
	Listed   int             `json:"listed"`
	Created  int             `json:"created"`
	Existing int             `json:"existing"`
	Failed   int             `json:"failed"`
	Errors   []BulkItemError `json:"errors,omitempty"`
}

// bulkErrorsKept bounds BulkResult.Errors.
const bulkErrorsKept = 20

// BulkProgress is where a bulk operation stands, read from its run: its
// status, the counts so far, and Remaining, the runs listed and not
// done yet. Listing is done when Listed is final (ListingDone).
type BulkProgress struct {
	OperationID string    `json:"operation_id"`
	RunID       string    `json:"run_id"`
	Status      RunStatus `json:"status"`
	BulkResult
	Done        int  `json:"done"`
	Remaining   int  `json:"remaining"`
	ListingDone bool `json:"listing_done"`
	// Error is why the operation failed, if it did.
	Error *RunError `json:"error,omitempty"`
}

// bulkPage is the result of a listing step: the runs of one page and the
// cursor of the next ("" for none).
type bulkPage struct {
	RunIDs []string `json:"run_ids"`
	Next   string   `json:"next,omitempty"`
}

// bulkItem is the result of one rerun step.
type bulkItem struct {
	RunID   string  `json:"run_id"`
	Rerun   string  `json:"rerun,omitempty"`
	Outcome Outcome `json:"outcome,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// BulkOperations is the workflow that runs bulk operations with client c
// (which reads and reruns runs in its process, so it needs a worker's
// rights). Register it on the workers that should run them.
func BulkOperations(c *Client) *Workflow[BulkRerun, BulkResult] {
	return NewWorkflow(BulkWorkflowName, func(ctx *Context, op BulkRerun) (BulkResult, error) {
		var res BulkResult
		source := ctx.RunID()
		for cursor := ""; ; {
			after := cursor
			page, err := Step(ctx, "list", func(sctx context.Context) (bulkPage, error) {
				p, err := c.ListRuns(sctx, ListOptions{Workflow: op.Filter.Workflow, Status: op.Filter.Status,
					RunIDPrefix: op.Filter.RunIDPrefix, Attributes: op.Filter.Attributes, Since: op.Filter.Since,
					Until: op.Filter.Until, After: after, Limit: bulkPageSize})
				if err != nil {
					return bulkPage{}, err
				}
				out := bulkPage{RunIDs: []string{}, Next: p.Next}
				for _, r := range p.Runs {
					out.RunIDs = append(out.RunIDs, r.RunID)
				}
				return out, nil
			})
			if err != nil {
				return res, err
			}
			res.Listed += len(page.RunIDs)
			for _, id := range page.RunIDs {
				item, err := Step(ctx, "rerun", func(sctx context.Context) (bulkItem, error) {
					return bulkRerunOne(sctx, c, id, op.From, source)
				})
				if err != nil {
					return res, err
				}
				res.add(item)
			}
			if page.Next == "" {
				return res, nil
			}
			cursor = page.Next
			if op.PerSecond > 0 {
				pace := time.Duration(float64(len(page.RunIDs)) / op.PerSecond * float64(time.Second))
				if err := Sleep(ctx, "pace", pace); err != nil {
					return res, err
				}
			}
		}
	})
}

// bulkRerunOne reruns runID for a bulk operation: an error that may pass
// (NATS unavailable) fails the step, which is retried; any other is the
// item's.
func bulkRerunOne(ctx context.Context, c *Client, runID, from, source string) (bulkItem, error) {
	r, err := c.Rerun(ctx, runID, RerunOptions{From: from, Source: source})
	switch {
	case err == nil:
		return bulkItem{RunID: runID, Rerun: r.RunID, Outcome: r.Start.Outcome}, nil
	case jetstream.IsTransient(err):
		return bulkItem{}, err
	default:
		return bulkItem{RunID: runID, Error: err.Error()}, nil
	}
}

func (r *BulkResult) add(item bulkItem) {
	switch {
	case item.Error != "":
		r.Failed++
		if len(r.Errors) < bulkErrorsKept {
			r.Errors = append(r.Errors, BulkItemError{RunID: item.RunID, Error: item.Error})
		}
	case item.Outcome == OutcomeCreated:
		r.Created++
	default:
		r.Existing++
	}
}

// StartBulkRerun starts the bulk operation opID that reruns what op
// selects, by asking a worker that serves BulkWorkflowName, and returns
// its progress. A repeat call, with any op, finds the operation it
// started (the first call's op counts). opID is 1..123 characters of
// [A-Za-z0-9_=-]. A filter without a workflow, with a status that is not
// an ended one or a negative pace is ErrInvalidBulk; no worker serving
// bulk operations is ErrNoWorker (retry later).
func (c *Client) StartBulkRerun(ctx context.Context, opID string, op BulkRerun) (_ BulkProgress, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	runID := BulkRunID(opID)
	if err := state.ValidateRunID(runID); err != nil {
		return BulkProgress{}, err
	}
	if err := op.validate(); err != nil {
		return BulkProgress{}, err
	}
	if op.Filter.Until.IsZero() {
		op.Filter.Until = time.Now().UTC()
	}
	in, err := json.Marshal(op)
	if err != nil {
		return BulkProgress{}, err
	}
	if _, err := c.StartByName(ctx, BulkWorkflowName, in, WithRunID(runID), WithFingerprintMode(FingerprintIgnore)); err != nil {
		return BulkProgress{}, err
	}
	return c.BulkProgress(ctx, opID)
}

// ErrInvalidBulk: a bulk operation's filter or pace is out of range.
var ErrInvalidBulk = errors.New("jetflow: invalid bulk operation")

func (op BulkRerun) validate() error {
	f := op.Filter
	if err := state.ValidateName(f.Workflow); err != nil {
		return fmt.Errorf("%w: filter workflow: %w", ErrInvalidBulk, err)
	}
	switch f.Status {
	case "":
	case StatusFailed, StatusCancelled, StatusCompleted:
	default:
		return fmt.Errorf("%w: status %q is not an ended state (failed, cancelled, completed)", ErrInvalidBulk, f.Status)
	}
	if op.PerSecond < 0 {
		return fmt.Errorf("%w: per_second %v is negative", ErrInvalidBulk, op.PerSecond)
	}
	if err := state.ValidateAttributes(f.Attributes); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidBulk, err)
	}
	return nil
}

// BulkProgress reads where the bulk operation opID stands: from its run's
// record and committed steps (exact: a rerun counts once it is
// committed). An unknown operation is ErrRunNotFound.
func (c *Client) BulkProgress(ctx context.Context, opID string) (_ BulkProgress, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	runID := BulkRunID(opID)
	run, err := c.GetRun(ctx, runID)
	if err != nil {
		return BulkProgress{}, err
	}
	if run.Workflow != BulkWorkflowName {
		return BulkProgress{}, fmt.Errorf("%w: %s is a run of %s, not a bulk operation", ErrRunNotFound, runID, run.Workflow)
	}
	steps, err := c.Steps(ctx, runID)
	if err != nil {
		return BulkProgress{}, err
	}
	out := BulkProgress{OperationID: opID, RunID: runID, Status: run.Status, Error: run.Error}
	for _, s := range steps {
		if s.Error != "" {
			continue
		}
		switch s.Name {
		case "list":
			var p bulkPage
			if err := json.Unmarshal(s.Output, &p); err != nil {
				return BulkProgress{}, fmt.Errorf("%w: %s: %w", ErrMalformed, s.StepID, err)
			}
			out.Listed += len(p.RunIDs)
			out.ListingDone = out.ListingDone || p.Next == ""
		case "rerun":
			var item bulkItem
			if err := json.Unmarshal(s.Output, &item); err != nil {
				return BulkProgress{}, fmt.Errorf("%w: %s: %w", ErrMalformed, s.StepID, err)
			}
			out.Done++
			out.add(item)
		}
	}
	out.Remaining = out.Listed - out.Done
	return out, nil
}
