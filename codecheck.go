package jetflow

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// CodeCheck is what a build's code would do to the runs in flight:
// CheckCode's report.
type CodeCheck struct {
	// Checked counts the runs in flight (running or blocked) of the
	// registry's workflows whose histories were replayed.
	Checked int `json:"checked"`
	// Blocked are the runs the code departs from: a worker running it
	// would block each (StatusBlocked) before its diverging step runs.
	Blocked []BlockedRun `json:"blocked"`
}

// BlockedRun is a run a build's code would block, and why.
type BlockedRun struct {
	RunID      string      `json:"run_id"`
	Workflow   string      `json:"workflow"`
	Divergence *Divergence `json:"divergence"`
}

// Clean reports whether the code replays every run checked.
func (c CodeCheck) Clean() bool { return len(c.Blocked) == 0 }

// ErrWouldBlock: a worker's code would block runs in flight
// (WorkerConfig.CheckBeforeServing); the *CodeCheckError names them.
var ErrWouldBlock = errors.New("jetflow: the worker's code diverges from runs in flight")

// CodeCheckError is a check that found runs the code would block.
type CodeCheckError struct{ Check CodeCheck }

func (e *CodeCheckError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d would be blocked", ErrWouldBlock, len(e.Check.Blocked), e.Check.Checked)
	for i, r := range e.Check.Blocked {
		if i == 5 {
			fmt.Fprintf(&b, "; and %d more", len(e.Check.Blocked)-i)
			break
		}
		fmt.Fprintf(&b, "; run %s (%s) %s", r.RunID, r.Workflow, r.Divergence)
	}
	return b.String()
}

func (e *CodeCheckError) Unwrap() error { return ErrWouldBlock }

// CheckCode replays the code of the workflows in ws against the history of
// every run of theirs in flight (running or blocked, as the run index
// lists them), running no step, and reports the runs the code would block:
// what a worker of this build would find on its first replay of each.
// Run it in CI against a live deployment before a deploy, or let a worker
// do it before it takes work (WorkerConfig.CheckBeforeServing). build is
// the code's build identity: a run of a pinned workflow pinned to another
// build is not this code's to run, and not checked. It reads each run's
// record and its steps once; a run that ends meanwhile is not reported.
func (c *Client) CheckCode(ctx context.Context, ws *Registry, build string) (_ CodeCheck, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	out := CodeCheck{Blocked: []BlockedRun{}}
	for _, name := range ws.Names() {
		def := ws.defs[name].Definition()
		for _, status := range []RunStatus{StatusRunning, StatusBlocked} {
			opts := ListOptions{Workflow: name, Status: status, Limit: MaxListLimit}
			for {
				page, err := c.ListRuns(ctx, opts)
				if err != nil {
					return out, err
				}
				for _, r := range page.Runs {
					if err := c.checkRun(ctx, def, build, r.RunID, &out); err != nil {
						return out, err
					}
				}
				if page.Next == "" {
					break
				}
				opts.After = page.Next
			}
		}
	}
	return out, nil
}

// checkRun checks one run in flight of def against its stored history.
func (c *Client) checkRun(ctx context.Context, def workflow.Definition, build, runID string, out *CodeCheck) error {
	run, _, err := c.runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return nil // gone meanwhile
	}
	if err != nil {
		return fmt.Errorf("jetflow: check run %s: %w", runID, err)
	}
	if !run.Status.Active() || run.Exec != state.ExecLease || def.Pinned && run.Build != "" && run.Build != build {
		return nil // ended, an earlier executor's, or pinned to another build: not this code's to replay
	}
	d, err := workflow.CheckStored(ctx, c.assets, def, run)
	if err != nil {
		return fmt.Errorf("jetflow: check run %s: %w", runID, err)
	}
	out.Checked++
	if d != nil {
		out.Blocked = append(out.Blocked, BlockedRun{RunID: runID, Workflow: run.Workflow, Divergence: d})
	}
	return nil
}
