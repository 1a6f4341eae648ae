package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/timeline"
)

// opTimeout bounds the NATS requests of every command but wait, and the
// client's setup.
const opTimeout = 10 * time.Second

// start asks a worker that serves workflow to start a run under runID, or
// under a generated run ID when generate is set (parseArgs allows exactly
// one), so that an unknown workflow, an undecodable input or an invalid run
// ID is refused before anything is stored.
func start(ctx context.Context, c *jetflow.Client, out *printer, workflow, input, runID string, generate bool, attrs map[string]string) error {
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
	opts := []jetflow.StartOption{opt}
	if len(attrs) > 0 {
		opts = append(opts, jetflow.WithAttributes(attrs))
	}
	res, err := c.StartByName(ctx, workflow, compact.Bytes(), opts...)
	if err != nil {
		return fmt.Errorf("start %s: %w", workflow, err)
	}
	return out.start(res)
}

// get prints a run's timeline: the run, its committed steps and its open
// steps (--output json: the body of GET /v1/runs/{id}).
func get(ctx context.Context, c *jetflow.Client, out *printer, runID string) error {
	tl, err := readTimeline(ctx, c, runID)
	if err != nil {
		return err
	}
	return out.run(tl)
}

// readTimeline reads the run's description (Client.Describe) within
// opTimeout.
func readTimeline(ctx context.Context, c *jetflow.Client, runID string) (jetflow.RunDescription, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return c.Describe(ctx, runID)
}

// watch prints the run's timeline, then each change as it happens (a step
// line, a change of status; --output json: the whole body again, one line
// each time it changes), until the run ends. It returns nil when the run
// completed and its *jetflow.RunError when it failed or was cancelled, as
// wait does.
//
// It does not poll in a loop: between two readings it waits in
// Client.WaitRun (a watch of the run's record) for the run to end, for at
// most interval, so that a step line appears within interval of its commit
// and the end of the run at once.
//
// NATS being unavailable is ridden out for up to --timeout an outage (p).
func watch(ctx context.Context, c *jetflow.Client, out *printer, runID string, interval time.Duration, p *patience) error {
	follow := out.follower()
	for {
		tl, err := readTimeline(ctx, c, runID)
		if p.retry(ctx, err) {
			continue
		}
		if err != nil {
			return err
		}
		p.ok()
		if err := follow(tl); err != nil {
			return err
		}
		if tl.Run.Status.Terminal() {
			if tl.Run.Error != nil {
				return tl.Run.Error
			}
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, interval)
		_, err = c.WaitRun(wctx, runID)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !p.retry(ctx, err) {
			return err
		}
	}
}

// wait waits until the run ends and prints its result. A run that did not
// complete is returned as its *jetflow.RunError. NATS being unavailable is
// ridden out until p's deadline, the end of --timeout (timeout).
func wait(ctx context.Context, c *jetflow.Client, out *printer, runID string, timeout time.Duration, p *patience) error {
	wctx, cancel := context.WithDeadline(ctx, p.deadline)
	defer cancel()
	run, err := c.WaitRun(wctx, runID)
	for p.retry(wctx, err) {
		run, err = c.WaitRun(wctx, runID)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		if down := p.down(); down != nil { // NATS, not the run, is why
			return fmt.Errorf("run %s: not seen to end within %s: %w", runID, timeout, down)
		}
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

// unblock makes a blocked run go on (Client.UnblockRun) and prints what it
// did: replayed with the workers' code, or, with accept, the history's step
// it waived and the code's step that runs again in its place, which the
// run's block (read first) names. A run that is not blocked is an error
// matching jetflow.ErrRunNotBlocked, a block with nothing to waive one
// matching jetflow.ErrNothingToWaive.
func unblock(ctx context.Context, c *jetflow.Client, out *printer, runID string, accept bool) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var div *jetflow.Divergence
	if accept {
		run, err := c.GetRun(ctx, runID)
		if err != nil {
			return err
		}
		if run.Block != nil {
			div = run.Block.Divergence
		}
	}
	res, err := c.UnblockRun(ctx, runID, jetflow.UnblockOptions{AcceptDivergence: accept})
	if errors.Is(err, jetflow.ErrRunNotBlocked) || errors.Is(err, jetflow.ErrNothingToWaive) {
		return fmt.Errorf("cannot unblock: %w", err)
	}
	if err != nil {
		return err
	}
	return out.unblocked(httpapi.NewUnblocked(res), div)
}

// rerun starts a rerun of the ended run runID (Client.Rerun), or with
// opts.DryRun only plans it, and prints the plan: the steps kept and the
// steps run again, and the new run's start.
func rerun(ctx context.Context, c *jetflow.Client, out *printer, runID string, opts jetflow.RerunOptions) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := c.Rerun(ctx, runID, opts)
	if err != nil {
		return fmt.Errorf("cannot rerun %s: %w", runID, err)
	}
	return out.rerun(res)
}

// list prints one page of runs, newest first, and the cursor of the next.
func list(ctx context.Context, c *jetflow.Client, out *printer, opts jetflow.ListOptions) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	page, err := c.ListRuns(ctx, opts)
	if err != nil {
		return err
	}
	return out.page(page)
}

// counts prints how many kept runs are in each state, of workflow or of
// all ("").
func counts(ctx context.Context, c *jetflow.Client, out *printer, workflow string) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	n, err := c.CountRuns(ctx, workflow)
	if err != nil {
		return err
	}
	return out.counts(n)
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

// workers prints who serves what now (Client.Roster): GET /v1/workers's
// body as JSON.
func workers(ctx context.Context, c *jetflow.Client, out *printer) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, err := c.Roster(ctx)
	if err != nil {
		return err
	}
	return out.roster(r, time.Now())
}

// engineTimeout bounds engine's reading: EngineStatus reads every kept run
// record once (seconds for a million runs).
const engineTimeout = time.Minute

// engine prints where an upgrade of the engine stands
// (Client.EngineStatus). It returns an *upgradeWait while a worker of
// another engine protocol is live or work of protocol 1 is left, nil once
// neither is: the old version's work is done and this version may run.
func engine(ctx context.Context, c *jetflow.Client, out *printer) error {
	ctx, cancel := context.WithTimeout(ctx, engineTimeout)
	defer cancel()
	s, err := c.EngineStatus(ctx)
	if err != nil {
		return err
	}
	if err := out.engine(s, time.Now()); err != nil {
		return err
	}
	return waitFor(s)
}

// upgradeWait is what an upgrade of the engine still waits for, and
// engine's exit code for it.
type upgradeWait struct {
	code int
	what string
}

func (u *upgradeWait) Error() string { return "waiting for: " + u.what }

// waitFor says what s still waits for: the live workers of another
// protocol (exitForeignWorkers: this version's workers execute nothing
// beside them), else the runs and messages of protocol 1 left
// (exitOldWork); nil when s is Ready and OldWorkDone.
func waitFor(s jetflow.EngineStatus) error {
	var what []string
	code := exitOldWork
	if !s.Ready() {
		code = exitForeignWorkers
		names := make([]string, 0, len(s.Foreign))
		for i, w := range s.Foreign {
			if i == 5 {
				names = append(names, fmt.Sprintf("and %d more", len(s.Foreign)-i))
				break
			}
			names = append(names, fmt.Sprintf("%s (%s)", w.Name, protocolName(w.Protocol)))
		}
		what = append(what, fmt.Sprintf("%d live worker(s) of another engine protocol to stop: %s; workers of protocol %d execute nothing beside them",
			len(s.Foreign), strings.Join(names, ", "), s.Protocol))
	}
	if !s.OldWorkDone() {
		what = append(what, fmt.Sprintf("protocol 1 (the executor before the lease): %d run(s) not taken over yet, %d task(s) or timer(s) left",
			s.LegacyRuns, s.LegacyMessages))
	}
	if len(what) == 0 {
		return nil
	}
	return &upgradeWait{code: code, what: strings.Join(what, "; ")}
}

// protocolName is how engine names an engine protocol: 0 is a version
// before protocols were recorded.
func protocolName(p int) string {
	if p == 0 {
		return "protocol 0, an earlier version"
	}
	return fmt.Sprintf("protocol %d", p)
}

// printer writes results as text or JSON.
type printer struct {
	w    io.Writer
	json bool
	// color: colour the run status in text (stdout is a terminal).
	color bool
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
	case res.Outcome == jetflow.OutcomeSuperseded:
		_, err = fmt.Fprintf(p.w, "superseded run %s: generation %d cancelled, generation %d started with this input\n", res.RunID, res.Generation-1, res.Generation)
	default:
		_, err = fmt.Fprintf(p.w, "existing run %s (status %s, %d duplicates absorbed)\n", res.RunID, res.Status, res.Duplicates)
	}
	return err
}

// rerun prints a rerun's plan and start: as JSON, the RerunResult.
func (p *printer) rerun(res jetflow.RerunResult) error {
	if p.json {
		return p.encode(res)
	}
	from := timeline.Clean(res.From)
	if from == "" {
		from = "after its last committed step"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rerun of %s from %s as %s\n", res.SourceRunID, from, res.RunID)
	for _, s := range res.Kept {
		fmt.Fprintf(&b, "  kept       %s\n", timeline.Clean(s.StepID))
	}
	for _, s := range res.Again {
		fmt.Fprintf(&b, "  runs again %s (as a new step ID: a new Idempotency-Key)\n", timeline.Clean(s.StepID))
	}
	switch {
	case res.Start == nil:
		b.WriteString("dry run: nothing started\n")
	case res.Start.Outcome == jetflow.OutcomeCreated:
		fmt.Fprintf(&b, "created run %s\n", res.RunID)
	default:
		fmt.Fprintf(&b, "existing run %s (status %s): this rerun was started before; --id names another\n", res.RunID, res.Start.Status)
	}
	_, err := io.WriteString(p.w, b.String())
	return err
}

// run prints a run's timeline, or as JSON the body of GET /v1/runs/{id}.
func (p *printer) run(tl jetflow.RunDescription) error {
	if p.json {
		return p.encode(tl)
	}
	return timeline.Write(p.w, tl, timeline.Options{Color: p.color})
}

// follower returns what watch prints each reading with: as text, the
// timeline and then what changed (timeline.Follower); as JSON, the body
// of GET /v1/runs/{id} on one line, each time it differs from the last.
func (p *printer) follower() func(jetflow.RunDescription) error {
	if !p.json {
		f := timeline.NewFollower(timeline.Options{Color: p.color})
		return func(tl jetflow.RunDescription) error { return f.Update(p.w, tl) }
	}
	var last []byte
	return func(tl jetflow.RunDescription) error {
		b, err := json.Marshal(tl)
		if err != nil || bytes.Equal(b, last) {
			return err
		}
		last = b
		_, err = fmt.Fprintf(p.w, "%s\n", b)
		return err
	}
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
	// An ATTRIBUTES column when a run of the page has attributes.
	withAttrs := slices.ContainsFunc(page.Runs, func(r jetflow.Run) bool { return len(r.Attributes) > 0 })
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	header := "RUN ID\tWORKFLOW\tSTATUS\tUPDATED\tCREATED\tDUPLICATES"
	if withAttrs {
		header += "\tATTRIBUTES"
	}
	fmt.Fprintln(tw, header)
	for _, r := range page.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d", r.RunID, r.Workflow, r.Status,
			r.UpdatedAt.UTC().Format(time.RFC3339), r.CreatedAt.UTC().Format(time.RFC3339), r.Duplicates)
		if withAttrs {
			a := attrsFlag(r.Attributes)
			fmt.Fprintf(tw, "\t%s", strconv.QuoteToGraphic(a.String()))
		}
		fmt.Fprintln(tw)
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

// counts prints the counts of runs by state: the body of GET
// /v1/runs/counts as JSON.
func (p *printer) counts(n jetflow.RunCounts) error {
	if p.json {
		return p.encode(n)
	}
	_, err := fmt.Fprintf(p.w, "running    %d\nblocked    %d\ncompleted  %d\nfailed     %d\ncancelled  %d\n",
		n.Running, n.Blocked, n.Completed, n.Failed, n.Cancelled)
	return err
}

// unblocked prints an unblock's outcome: the HTTP API's body as JSON; as
// text, what it did, and for a waived step (div: the block it lifted) the
// step of the code that runs again in its place.
func (p *printer) unblocked(u httpapi.Unblocked, div *jetflow.Divergence) error {
	if p.json {
		return p.encode(u)
	}
	if u.Waived == "" {
		_, err := fmt.Fprintf(p.w, "unblocked %s: %s, replayed with the workers' code (blocked again if it still diverges)\n", u.RunID, u.Status)
		return err
	}
	if _, err := fmt.Fprintf(p.w, "unblocked %s: %s, without step %s of its history (waived)\n", u.RunID, u.Status, timeline.Clean(u.Waived)); err != nil {
		return err
	}
	var err error
	switch {
	case div == nil:
		_, err = fmt.Fprintf(p.w, "runs again: the code's step at the waived step's place: its side effects repeat\n")
	case div.Code == nil:
		_, err = fmt.Fprintf(p.w, "the code starts no step at place %d: the run goes on without the waived step\n", div.Position)
	default:
		_, err = fmt.Fprintf(p.w, "runs again: %s, the code's step at place %d: its side effects repeat\n", timeline.Clean(div.Code.String()), div.Position)
	}
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

// roster prints a Roster: as text, a table of the workers running now
// (times in UTC, the last heartbeat as an age at now), then one line per
// known workflow with the workers serving it, or "no worker running".
func (p *printer) roster(r jetflow.Roster, now time.Time) error {
	if p.json {
		return p.encode(r)
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tID\tWORKFLOWS\tBUILD\tSINCE\tLAST BEAT")
	for _, w := range r.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s ago\n", timeline.Clean(w.Name), w.ID, strings.Join(w.Workflows, ","), buildOf(w),
			w.Since.UTC().Format(time.DateTime), now.Sub(w.Beat).Round(time.Second))
	}
	if len(r.Workers) == 0 {
		fmt.Fprintln(tw, "(no worker running)")
	}
	fmt.Fprintln(tw, "\nWORKFLOW\tSERVED BY")
	for _, wf := range r.Workflows {
		by := "no worker running"
		if len(wf.Workers) > 0 {
			by = timeline.Clean(strings.Join(wf.Workers, ","))
		}
		fmt.Fprintf(tw, "%s\t%s\n", wf.Workflow, by)
	}
	return tw.Flush()
}

// engine prints an EngineStatus: GET /v1/engine's body as JSON; as text,
// its counts, a table of the live
// workers of another protocol (the last heartbeat as an age at now), a
// table of the runs under way by workflow and build, and, when nothing is
// left to wait for, a line that says so (what is left goes to stderr).
func (p *printer) engine(s jetflow.EngineStatus, now time.Time) error {
	if p.json {
		return p.encode(s)
	}
	protocols := slices.SortedFunc(maps.Keys(s.Workers), func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return y - x
	})
	live := make([]string, len(protocols))
	for i, k := range protocols {
		n, _ := strconv.Atoi(k)
		live[i] = fmt.Sprintf("%d of %s", s.Workers[k], protocolName(n))
	}
	if len(live) == 0 {
		live = []string{"none"}
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "engine protocol:\t%d (this version)\n", s.Protocol)
	fmt.Fprintf(tw, "live workers:\t%s\n", strings.Join(live, ", "))
	fmt.Fprintf(tw, "protocol 1 runs:\t%d (runs of the executor before the lease not taken over yet)\n", s.LegacyRuns)
	fmt.Fprintf(tw, "protocol 1 messages:\t%d (its tasks and timers left)\n", s.LegacyMessages)
	fmt.Fprintf(tw, "undecodable records:\t%d (run records this version cannot read)\n", s.Undecodable)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(tw, "\nFOREIGN WORKER\tPROTOCOL\tBUILD\tLAST BEAT")
	for _, w := range s.Foreign {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s ago\n", timeline.Clean(w.Name), w.Protocol, orDash(timeline.Clean(w.Build)), now.Sub(w.Beat).Round(time.Second))
	}
	if len(s.Foreign) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	fmt.Fprintln(tw, "\nWORKFLOW\tBUILD\tRUNS UNDER WAY")
	for _, wf := range slices.Sorted(maps.Keys(s.Builds)) {
		for _, build := range slices.Sorted(maps.Keys(s.Builds[wf])) {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", wf, orDash(timeline.Clean(build)), s.Builds[wf][build])
		}
	}
	if len(s.Builds) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if waitFor(s) != nil {
		return nil
	}
	_, err := fmt.Fprintf(p.w, "\ndone: no worker of another engine protocol is live and nothing of protocol 1 is left\n")
	return err
}

// orDash is s, or "-" for nothing.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// buildOf is a worker's build as the roster table shows it: "-" for none,
// and its engine protocol when it is not this version's (the runs each
// build holds: producer engine).
func buildOf(w jetflow.LiveWorker) string {
	b := w.Build
	if b == "" {
		b = "-"
	}
	if w.Protocol != jetflow.EngineProtocol {
		b += fmt.Sprintf(" (engine protocol %d)", w.Protocol)
	}
	return timeline.Clean(b)
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
