package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The waiters and backlog phases measure what waiting and queueing cost:
//
//   - waiters: --waiters runs are started, each held in its first step
//     until the bench releases them; Client.WaitRun is called for one run,
//     then for every run at once, and the server's consumer count (on the
//     runs bucket's stream, and in the account) is read each time. Then
//     the runs are released; every wait must return its run completed with
//     its output. The target: no more consumers for many waits than for one.
//   - backlog: --backlog runs are started with no worker, then one worker
//     process (the waits phases' worker) drains them; its peak RSS, its RSS
//     and heap after the drain, and the drain rate.

// blockRelease is closed by the waiters phase to let every bench_block run
// finish its first step.
var blockRelease atomic.Pointer[chan struct{}]

// blockWorkflow holds its run in its one step until blockRelease is
// closed; its output is its input + 1.
var blockWorkflow = jetflow.NewWorkflow("bench_block", func(ctx *jetflow.Context, in int) (int, error) {
	return jetflow.Step(ctx, "held", func(sctx context.Context) (int, error) {
		if ch := blockRelease.Load(); ch != nil {
			select {
			case <-*ch:
			case <-sctx.Done():
				return 0, sctx.Err()
			}
		}
		return in + 1, nil
	})
})

// backlogWorkflow is one trivial step; its output is backlogOutput.
var backlogWorkflow = jetflow.NewWorkflow("bench_backlog", func(ctx *jetflow.Context, _ int) (int, error) {
	return jetflow.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil })
})

const backlogOutput = "1"

// waiterFigures is one repetition of the waiters phase.
type waiterFigures struct {
	n int
	// base, one, many: consumers on the runs bucket's stream before any
	// wait, with one wait and with n waits; the account's consumers apart.
	base, one, many             int
	acctBase, acctOne, acctMany int
	drain                       time.Duration // release -> every wait returned
}

func (f waiterFigures) rate() float64 { return float64(f.n) / f.drain.Seconds() }

var waiterResults []waiterFigures

// consumerCounts reads the consumers on the runs bucket's stream and in
// the account.
func consumerCounts(ctx context.Context, assets *jetstream.Assets) (runs, account int, err error) {
	s, err := assets.JS.Stream(ctx, "KV_"+jetstream.RunsBucket)
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	acct, err := assets.JS.AccountInfo(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.Consumers, acct.Consumers, nil
}

// settledConsumers polls the consumer counts until the runs stream's
// reaches want, or has not changed for window (the waits being set up
// make no more), and returns the last counts read.
func settledConsumers(ctx context.Context, assets *jetstream.Assets, want int, window time.Duration) (runs, account int, err error) {
	last, since := -1, time.Now()
	for {
		runs, account, err = consumerCounts(ctx, assets)
		if err != nil || runs >= want {
			return runs, account, err
		}
		if runs != last {
			last, since = runs, time.Now()
		} else if time.Since(since) >= window {
			return runs, account, nil
		}
		if err := pause(ctx, 20*time.Millisecond); err != nil {
			return runs, account, err
		}
	}
}

// waitersPhase is one repetition of the waiters phase.
func waitersPhase(ctx context.Context, e *env, cfg config, label string) (f waiterFigures, err error) {
	f.n = cfg.waiters
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	blockRelease.Store(&release)
	defer func() { releaseOnce(); blockRelease.Store(nil) }()

	client, assets, err := waitsClient(ctx, e, label+"-client")
	if err != nil {
		return f, err
	}
	wnc, err := e.conn(label + "-worker")
	if err != nil {
		return f, err
	}
	worker, err := startWorker(ctx, wnc, cfg, label+"-worker", &logCounter{}, zerolog.WarnLevel, blockWorkflow)
	if err != nil {
		return f, err
	}
	defer func() {
		releaseOnce()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if serr := worker.Stop(sctx); serr != nil && err == nil {
			err = fmt.Errorf("stop worker: %w", serr)
		}
	}()

	ids := make([]string, f.n)
	for i := range ids {
		ids[i] = label + "-" + strconv.Itoa(i)
	}
	if _, err := parallel(ctx, f.n, cfg.starters, func(ctx context.Context, i int) error {
		_, err := jetflow.Start(ctx, client, blockWorkflow, i, jetflow.WithRunID(ids[i]))
		return err
	}); err != nil {
		return f, fmt.Errorf("start: %w", err)
	}
	if f.base, f.acctBase, err = consumerCounts(ctx, assets); err != nil {
		return f, err
	}

	wctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	var wg sync.WaitGroup
	var bad atomic.Int64
	errs := make([]error, f.n)
	wait := func(i int) {
		wg.Go(func() {
			r, err := client.WaitRun(wctx, ids[i])
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("wait %s: %w", ids[i], err)
			case r.Status != jetflow.StatusCompleted || string(r.Output) != strconv.Itoa(i+1):
				bad.Add(1)
				errs[i] = fmt.Errorf("wait %s: %s with output %s, want completed with %d", ids[i], r.Status, r.Output, i+1)
			}
		})
	}
	wait(0)
	if f.one, f.acctOne, err = settledConsumers(ctx, assets, f.base+1, cfg.waitWindow); err != nil {
		cancel()
		wg.Wait()
		return f, err
	}
	for i := 1; i < f.n; i++ {
		wait(i)
	}
	if f.many, f.acctMany, err = settledConsumers(ctx, assets, f.base+f.n, cfg.waitWindow); err != nil {
		cancel()
		wg.Wait()
		return f, err
	}
	t0 := time.Now()
	releaseOnce()
	wg.Wait()
	f.drain = time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return f, fmt.Errorf("%d waits did not return their completed run: %w", bad.Load(), firstErr(errs))
	}
	return f, nil
}

// firstErr is the first non-nil error of errs.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// backlogFigures is one repetition of the backlog phase.
type backlogFigures struct {
	n            int
	start, drain time.Duration // every start call; worker process started -> last run completed
	peakRSS, rss uint64        // the worker process's peak RSS, and its RSS after the drain (after a GC)
	heap         uint64        // its live heap after the drain
	logs         []string
}

func (f backlogFigures) rate() float64 { return float64(f.n) / f.drain.Seconds() }

var backlogResults []backlogFigures

// backlogPhase starts --backlog runs with no worker, then one worker
// process drains them; every run record is checked afterwards.
func backlogPhase(ctx context.Context, e *env, cfg config, label string) (f backlogFigures, err error) {
	f.n = cfg.backlog
	client, assets, err := waitsClient(ctx, e, label+"-client")
	if err != nil {
		return f, err
	}
	ids := make([]string, f.n)
	index := make(map[string]int, f.n)
	for i := range ids {
		ids[i] = label + "-" + strconv.Itoa(i)
		index[ids[i]] = i
	}
	if f.start, err = parallel(ctx, f.n, cfg.starters, func(ctx context.Context, i int) error {
		_, err := jetflow.Start(ctx, client, backlogWorkflow, i, jetflow.WithRunID(ids[i]))
		return err
	}); err != nil {
		return f, fmt.Errorf("start: %w", err)
	}
	t := newTracker(f.n)
	stopWatch, err := watchCompletions(ctx, assets, index, t, func(r state.Run) bool { return r.Status == state.StatusCompleted })
	if err != nil {
		return f, err
	}
	defer stopWatch()
	t0 := time.Now()
	w, err := spawnWaitsWorker(ctx, e, cfg, label+"-worker")
	if err != nil {
		return f, err
	}
	defer w.close(&err, &f.logs)
	if err := t.wait(ctx, cfg.timeout); err != nil {
		return f, err
	}
	f.drain = time.Since(t0)
	st, err := w.stats(ctx, "")
	if err != nil {
		return f, err
	}
	f.peakRSS, f.rss, f.heap = st.PeakRSS, st.RSS, st.HeapAlloc
	if n := t.failed.Load(); n > 0 {
		return f, fmt.Errorf("%d runs did not complete", n)
	}
	return f, verifyRuns(ctx, assets, ids, backlogOutput)
}

// printWaiterReport prints the waiters phase's figures (medians).
func printWaiterReport(out io.Writer) {
	if len(waiterResults) == 0 {
		return
	}
	n := func(f func(waiterFigures) float64) string { return num(medianWaits(waiterResults, f)) }
	c := func(f func(waiterFigures) int) string {
		return strconv.Itoa(int(medianWaits(waiterResults, func(x waiterFigures) float64 { return float64(f(x)) })))
	}
	one, many := medianWaits(waiterResults, func(x waiterFigures) float64 { return float64(x.one - x.base) }), medianWaits(waiterResults, func(x waiterFigures) float64 { return float64(x.many - x.base) })
	fmt.Fprintf(out, "waiters: %s runs held in their first step, waited for with Client.WaitRun\n", num(float64(waiterResults[0].n)))
	printTable(out, [4]string{"metric", "1 wait", n(func(x waiterFigures) float64 { return float64(x.n) }) + " waits", "target: no more for many"},
		[][4]string{
			{"consumers on KV_" + jetstream.RunsBucket + " (before any wait: " + c(func(x waiterFigures) int { return x.base }) + ")", c(func(x waiterFigures) int { return x.one }), c(func(x waiterFigures) int { return x.many }),
				map[bool]string{true: "met", false: "missed"}[many <= one]},
			{"consumers in the account (before: " + c(func(x waiterFigures) int { return x.acctBase }) + ")", c(func(x waiterFigures) int { return x.acctOne }), c(func(x waiterFigures) int { return x.acctMany }), ""},
			{"waits completed/s (release -> every wait returned)", "-", n(waiterFigures.rate), ""},
		})
	fmt.Fprintln(out)
}

// printBacklogReport prints the backlog phase's figures (medians).
func printBacklogReport(out io.Writer) {
	if len(backlogResults) == 0 {
		return
	}
	m := func(f func(backlogFigures) float64) float64 { return medianWaits(backlogResults, f) }
	fmt.Fprintf(out, "backlog: %s runs started with no worker (%s starts/s), then drained by one worker process\n",
		num(float64(backlogResults[0].n)), num(m(func(x backlogFigures) float64 { return float64(x.n) / x.start.Seconds() })))
	fmt.Fprintf(out, "  drain runs/s %s; worker peak RSS %s; after the drain RSS %s, Go heap %s\n",
		num(m(backlogFigures.rate)), mib(m(func(x backlogFigures) float64 { return float64(x.peakRSS) })),
		mib(m(func(x backlogFigures) float64 { return float64(x.rss) })), mib(m(func(x backlogFigures) float64 { return float64(x.heap) })))
	printWaitLogs(out, "backlog", allLogs(backlogResults, func(x backlogFigures) []string { return x.logs }))
	fmt.Fprintln(out)
}
