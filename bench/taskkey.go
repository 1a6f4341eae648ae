package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The taskkey phase measures task idempotency keys (G7) against a plain
// step in one worker, on the same server: three workflows of three trivial
// steps each,
//
//   - plain: steps without a key;
//   - miss:  every step with a key of its own (the step runs: claim, run,
//     result written under the key, step record committed);
//   - hit:   every step with one of three global keys whose results are
//     already cached (the step does not run: key read, step record
//     committed from it).
//
// Each runs taskKeyRuns() runs from 16 starters; steps/s is 3 x runs over
// the time from the first start to the last completion. A hit costs one KV
// read more than a plain step and saves the step body, which here does
// nothing: the figure is the engine's cost of a cache hit, not the savings
// on a real (slow, external) step.

// taskKeyFigures is one repetition of the phase, in steps/s.
type taskKeyFigures struct {
	plain, miss, hit float64
	logs             []string // the worker's warnings, summarised
}

// taskKeyResults collects the repetitions; printTaskKeyReport prints them.
var taskKeyResults []taskKeyFigures

const taskKeyStarters = 16

func taskKeyRuns(cfg config) int { return max(1, cfg.runs/4) }

func taskKeyWorkflow(name string, key func(runID, step string) []jetflow.StepOption) *jetflow.Workflow[int, int] {
	return jetflow.NewWorkflow(name, func(ctx *jetflow.Context, in int) (int, error) {
		sum := in
		for i, step := range []string{"a", "b", "c"} {
			v, err := jetflow.Step(ctx, step, func(context.Context) (int, error) { return i + 1, nil },
				key(ctx.RunID(), step)...)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
}

var (
	tkPlain = taskKeyWorkflow("bench_tk_plain", func(string, string) []jetflow.StepOption { return nil })
	tkMiss  = taskKeyWorkflow("bench_tk_miss", func(runID, step string) []jetflow.StepOption {
		return []jetflow.StepOption{jetflow.WithTaskKey(runID+"/"+step, 10*time.Minute), jetflow.WithKeyScope(jetflow.ScopeWorkflow)}
	})
	// tkHitRep is the repetition whose keys tkHit uses (a fresh set per
	// repetition, warmed by one run first).
	tkHitRep atomic.Int64
	tkHit    = taskKeyWorkflow("bench_tk_hit", func(_, step string) []jetflow.StepOption {
		return []jetflow.StepOption{jetflow.WithTaskKey("hit-"+strconv.FormatInt(tkHitRep.Load(), 10)+"/"+step, 10*time.Minute),
			jetflow.WithKeyScope(jetflow.ScopeGlobal)}
	})
)

func engineTaskKey(ctx context.Context, e *env, cfg config, rep int) (f taskKeyFigures, err error) {
	wnc, err := e.conn("tk-worker")
	if err != nil {
		return f, err
	}
	cnc, err := e.conn("tk-client")
	if err != nil {
		return f, err
	}
	ws := jetflow.NewRegistry()
	if err := ws.Register(tkPlain, tkMiss, tkHit); err != nil {
		return f, err
	}
	logs := &logCounter{}
	worker, err := jetflow.NewWorker(wnc, ws, jetflow.WorkerConfig{
		Name: "bench-tk-worker", Concurrency: cfg.concurrency, Logger: zerolog.New(logs).Level(zerolog.WarnLevel),
	})
	if err != nil {
		return f, err
	}
	if err := worker.Start(ctx); err != nil {
		return f, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if serr := worker.Stop(sctx); serr != nil && err == nil {
			err = fmt.Errorf("stop worker: %w", serr)
		}
		f.logs = logs.summary()
	}()
	client, err := jetflow.NewClient(ctx, cnc, jetflow.ClientConfig{Name: "bench"})
	if err != nil {
		return f, err
	}
	assets, err := jetstream.Provision(ctx, cnc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return f, err
	}

	n := taskKeyRuns(cfg)
	prefix := "tk-" + strconv.Itoa(rep) + "-"
	tkHitRep.Store(int64(rep))
	// Warm the hit keys with one run.
	h, err := jetflow.Start(ctx, client, tkHit, 0, jetflow.WithRunID(prefix+"warm"))
	if err != nil {
		return f, err
	}
	if out, err := h.Result(ctx); err != nil || out != 6 {
		return f, fmt.Errorf("warm-up run: %d, %v", out, err)
	}

	measure := func(wf *jetflow.Workflow[int, int], kind string) (float64, error) {
		ids := make([]string, n)
		index := make(map[string]int, n)
		for i := range ids {
			ids[i] = prefix + kind + "-" + strconv.Itoa(i)
			index[ids[i]] = i
		}
		t := newTracker(n)
		var wrong atomic.Int64
		stop, err := watchCompletions(ctx, assets, index, t, func(r state.Run) bool {
			good := r.Status == state.StatusCompleted && string(r.Output) == "6"
			if !good {
				wrong.Add(1)
			}
			return good
		})
		if err != nil {
			return 0, err
		}
		defer stop()
		_, err = parallel(ctx, n, taskKeyStarters, func(ctx context.Context, i int) error {
			t.started(i)
			_, err := jetflow.Start(ctx, client, wf, 0, jetflow.WithRunID(ids[i]))
			return err
		})
		if err != nil {
			return 0, err
		}
		if err := t.wait(ctx, cfg.timeout); err != nil {
			return 0, err
		}
		if w := wrong.Load(); w > 0 {
			return 0, fmt.Errorf("%s: %d runs did not complete with output 6", kind, w)
		}
		return t.summarize(stepsPerRun).stepsPerSec(), nil
	}
	if f.plain, err = measure(tkPlain, "plain"); err != nil {
		return f, err
	}
	if f.miss, err = measure(tkMiss, "miss"); err != nil {
		return f, err
	}
	if f.hit, err = measure(tkHit, "hit"); err != nil {
		return f, err
	}
	// Every hit run was served: its steps' records name the key.
	for _, id := range []string{prefix + "hit-0", prefix + "hit-" + strconv.Itoa(n-1)} {
		steps, err := client.Steps(ctx, id)
		if err != nil {
			return f, err
		}
		for _, s := range steps {
			if s.TaskKey == nil || !s.TaskKey.Served {
				return f, fmt.Errorf("step %s of a hit run was not served from its key (worker %q)", s.StepID, s.Worker)
			}
		}
	}
	return f, nil
}

// printTaskKeyReport prints the phase's figures next to the raw KV create
// rate of the same run, and the hit / real step ratios.
func printTaskKeyReport(out io.Writer, r *results) {
	if len(taskKeyResults) == 0 {
		return
	}
	pick := func(f func(taskKeyFigures) float64) float64 {
		xs := make([]float64, len(taskKeyResults))
		for i, x := range taskKeyResults {
			xs[i] = f(x)
		}
		return median(xs)
	}
	plain := pick(func(x taskKeyFigures) float64 { return x.plain })
	miss := pick(func(x taskKeyFigures) float64 { return x.miss })
	hit := pick(func(x taskKeyFigures) float64 { return x.hit })
	kv := median(r.kvRates)
	kvRef := "raw KV create " + strconv.Itoa(r.cfg.kvG) + "g " + num(kv)
	rows := [][4]string{
		{"task key: plain step (no key) steps/s", num(plain), kvRef, ratio(plain, kv)},
		{"task key: real step run (key miss) steps/s", num(miss), kvRef, ratio(miss, kv)},
		{"task key: cache hit steps/s", num(hit), kvRef, ratio(hit, kv)},
		{"task key: cache hit / real step run", ratio(hit, miss), "", ""},
		{"task key: cache hit / plain step", ratio(hit, plain), "", ""},
	}
	w := [3]int{len("metric"), len("jetflow"), len("raw reference")}
	for _, rw := range rows {
		w[0], w[1], w[2] = max(w[0], len(rw[0])), max(w[1], len(rw[1])), max(w[2], len(rw[2]))
	}
	fmt.Fprintf(out, "task keys: %s runs x %d steps per workload, %d starters, worker concurrency %d\n",
		num(float64(taskKeyRuns(r.cfg))), stepsPerRun, taskKeyStarters, r.cfg.concurrency)
	fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], "metric", w[1], "jetflow", w[2], "raw reference", "ratio (jetflow/raw)")
	fmt.Fprintf(out, "%s-+-%s-+-%s-+-%s\n", strings.Repeat("-", w[0]), strings.Repeat("-", w[1]), strings.Repeat("-", w[2]), strings.Repeat("-", 19))
	for _, rw := range rows {
		fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], rw[0], w[1], rw[1], w[2], rw[2], rw[3])
	}
	for i, x := range taskKeyResults {
		for _, line := range x.logs {
			fmt.Fprintf(out, "task keys #%d: %s\n", i+1, line)
		}
	}
	fmt.Fprintln(out)
}
