package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/httpapi"
)

// opTimeout bounds the NATS requests of every command but wait, and the
// client's setup.
const opTimeout = 10 * time.Second

// start asks a worker that serves workflow to start a run under runID, or
// under a generated run ID when generate is set (parseArgs allows exactly
// one), so that an unknown workflow, an undecodable input or an invalid run
// ID is refused before anything is stored.
func start(ctx context.Context, c *jetflow.Client, out *printer, workflow, input, runID string, generate bool) error {
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(input)); err != nil {
		return fmt.Errorf("invalid JSON input: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	opt := jetflow.WithRunID(runID)
	if generate {
		opt = jetflow.WithGeneratedRunID()
	}
	res, err := c.StartByName(ctx, workflow, compact.Bytes(), opt)
	if err != nil {
		return fmt.Errorf("start %s: %w", workflow, err)
	}
	return out.start(res)
}

// get prints a run and its committed steps.
func get(ctx context.Context, c *jetflow.Client, out *printer, runID string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	run, err := c.GetRun(ctx, runID)
	if err != nil {
		return err
	}
	steps, err := c.Steps(ctx, runID)
	if err != nil {
		return err
	}
	return out.run(run, steps)
}

// wait waits until the run ends and prints its result. A run that did not
// complete is returned as its *jetflow.RunError.
func wait(ctx context.Context, c *jetflow.Client, out *printer, runID string, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	run, err := c.WaitRun(wctx, runID)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("run %s did not end within %s", runID, timeout)
	}
	if err != nil {
		return err
	}
	if err := out.result(run); err != nil {
		return err
	}
	if run.Error != nil {
		return run.Error
	}
	return nil
}

// cancelRun cancels a running run and the child runs it started attached,
// and prints what it did. A repeat succeeds and says the run was already
// cancelled; a run that had completed or failed is an error matching
// jetflow.ErrRunEnded that names the state it ended in.
func cancelRun(ctx context.Context, c *jetflow.Client, out *printer, runID string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := c.CancelRun(ctx, runID)
	if errors.Is(err, jetflow.ErrRunEnded) {
		return fmt.Errorf("cannot cancel: %w", err)
	}
	if err != nil {
		return err
	}
	return out.cancelled(httpapi.NewCancelled(res))
}

// list prints one page of runs and the cursor of the next.
func list(ctx context.Context, c *jetflow.Client, out *printer, opts jetflow.ListOptions) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	page, err := c.ListRuns(ctx, opts)
	if err != nil {
		return err
	}
	return out.page(page)
}

// reset forgets a task idempotency key and prints how many step entries
// that deleted: 0 when the key was not set, had expired or was reset
// already.
func reset(ctx context.Context, c *jetflow.Client, out *printer, key string, scope jetflow.KeyScope, scopeID string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	n, err := c.ResetTaskKey(ctx, key, scope, scopeID)
	if err != nil {
		return fmt.Errorf("reset key: %w", err)
	}
	r := httpapi.KeyReset{Key: key, Scope: scope.String(), Deleted: n}
	switch scope {
	case jetflow.ScopeWorkflow:
		r.Workflow = scopeID
	case jetflow.ScopeRun:
		r.RunID = scopeID
	}
	return out.reset(r)
}

// printer writes results as text or JSON.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) encode(v any) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (p *printer) start(res jetflow.StartResult) error {
	if p.json {
		return p.encode(res)
	}
	var err error
	switch {
	case res.Outcome == jetflow.OutcomeCreated && res.AfterExpiry:
		_, err = fmt.Fprintf(p.w, "created run %s (an earlier run with this ID had expired)\n", res.RunID)
	case res.Outcome == jetflow.OutcomeCreated:
		_, err = fmt.Fprintf(p.w, "created run %s\n", res.RunID)
	case res.Outcome == jetflow.OutcomeRestarted:
		_, err = fmt.Fprintf(p.w, "restarted run %s (the previous run had ended; the conflict policy starts a new one)\n", res.RunID)
	default:
		_, err = fmt.Fprintf(p.w, "existing run %s (status %s, %d duplicates absorbed)\n", res.RunID, res.Status, res.Duplicates)
	}
	return err
}

func (p *printer) run(run jetflow.Run, steps []jetflow.StepRecord) error {
	if p.json {
		return p.encode(httpapi.NewRunWithSteps(run, steps))
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "run:\t%s\n", run.RunID)
	fmt.Fprintf(tw, "workflow:\t%s\n", run.Workflow)
	fmt.Fprintf(tw, "status:\t%s\n", run.Status)
	fmt.Fprintf(tw, "source:\t%s\n", run.Source)
	fmt.Fprintf(tw, "created:\t%s\n", run.CreatedAt.Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "updated:\t%s\n", run.UpdatedAt.Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "duplicates:\t%d\n", run.Duplicates)
	fmt.Fprintf(tw, "input:\t%s\n", run.Input)
	if len(run.Output) > 0 {
		fmt.Fprintf(tw, "output:\t%s\n", run.Output)
	}
	if run.Error != nil {
		fmt.Fprintf(tw, "error:\t%s: %s\n", run.Error.Kind, run.Error.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := p.duplicates(run); err != nil {
		return err
	}
	if len(steps) == 0 {
		_, err := fmt.Fprintln(p.w, "steps: none committed")
		return err
	}
	fmt.Fprintln(p.w, "steps:")
	tw = tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  STEP ID\tATTEMPT\tRESULT")
	for _, s := range steps {
		result := string(s.Output)
		switch {
		case s.Fatal:
			result = "fatal error: " + s.Error
		case s.Error != "":
			result = "error: " + s.Error
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", s.StepID, s.Attempt, result)
	}
	return tw.Flush()
}

// duplicates prints the run's duplicate audit: the first attempt and the
// most recent ones.
func (p *printer) duplicates(run jetflow.Run) error {
	if run.FirstDuplicate == nil {
		return nil
	}
	fmt.Fprintln(p.w, "duplicate starts (first, then the most recent):")
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  AT	SOURCE	OUTCOME	SAME INPUT	RUN WAS")
	row := func(d jetflow.DuplicateAttempt) {
		fmt.Fprintf(tw, "  %s	%s	%s	%t	%s\n", d.At.Format(time.RFC3339Nano), d.Source, d.Outcome, d.FingerprintMatch, d.Status)
	}
	row(*run.FirstDuplicate)
	if n := run.Duplicates - 1 - int64(len(run.RecentDuplicates)); n > 0 {
		fmt.Fprintf(tw, "  ... %d more\t\t\t\t\n", n)
	}
	for i, d := range run.RecentDuplicates {
		if i == 0 && run.Duplicates <= int64(len(run.RecentDuplicates)) {
			continue // the first one, shown above
		}
		row(d)
	}
	return tw.Flush()
}

func (p *printer) result(run jetflow.Run) error {
	if p.json {
		return p.encode(run)
	}
	if run.Error != nil {
		// The error itself goes to stderr.
		_, err := fmt.Fprintf(p.w, "run %s %s\n", run.RunID, run.Status)
		return err
	}
	_, err := fmt.Fprintf(p.w, "run %s %s: %s\n", run.RunID, run.Status, run.Output)
	return err
}

func (p *printer) page(page jetflow.RunPage) error {
	if p.json {
		return p.encode(httpapi.RunList(page))
	}
	if len(page.Runs) == 0 {
		_, err := fmt.Fprintln(p.w, "no runs")
		return err
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN ID\tWORKFLOW\tSTATUS\tCREATED\tDUPLICATES")
	for _, r := range page.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", r.RunID, r.Workflow, r.Status, r.CreatedAt.Format(time.RFC3339), r.Duplicates)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next == "" {
		return nil
	}
	_, err := fmt.Fprintf(p.w, "next cursor: %s (list --cursor %s for the next page)\n", page.Next, page.Next)
	return err
}

// cancelled prints a cancel's outcome: the HTTP API's body as JSON; as
// text, the run and then each child run cancelled with it, one a line.
func (p *printer) cancelled(c httpapi.Cancelled) error {
	if p.json {
		return p.encode(c)
	}
	var err error
	if c.AlreadyCancelled {
		_, err = fmt.Fprintf(p.w, "%s was already cancelled\n", c.RunID)
	} else {
		_, err = fmt.Fprintf(p.w, "cancelled %s\n", c.RunID)
	}
	for _, child := range c.Children {
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.w, "cancelled child run %s\n", child)
	}
	return err
}

// reset prints a key reset: the HTTP API's body as JSON.
func (p *printer) reset(r httpapi.KeyReset) error {
	if p.json {
		return p.encode(r)
	}
	where := r.Scope + " scope"
	if id := r.Workflow + r.RunID; id != "" { // at most one is set
		where += " " + id
	}
	_, err := fmt.Fprintf(p.w, "deleted %d entries of key %q (%s)\n", r.Deleted, r.Key, where)
	return err
}
