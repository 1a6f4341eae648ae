package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// lastStepRan is called by the last step of e2eWorkflow with the run ID:
// a diagnostic of how long the run takes to be seen completed after its
// last step body ran (finish + watch delivery). Each e2e pass adds its
// hook for its duration; passes may run at once (in tests).
var lastStepRan hooks

// hooks is a set of functions of a run ID, safe for concurrent use.
type hooks struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(runID string)
}

// add adds f to the set until the returned function is called.
func (h *hooks) add(f func(runID string)) (remove func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fns == nil {
		h.fns = map[int]func(string){}
	}
	id := h.next
	h.next++
	h.fns[id] = f
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.fns, id)
	}
}

// call calls every function of the set with runID.
func (h *hooks) call(runID string) {
	h.mu.Lock()
	fns := make([]func(string), 0, len(h.fns))
	for _, f := range h.fns {
		fns = append(fns, f)
	}
	h.mu.Unlock()
	for _, f := range fns {
		f(runID)
	}
}

// e2eWorkflow is three trivial steps; the output (1+2+3) is checked.
var e2eWorkflow = jetflow.NewWorkflow("bench_e2e", func(ctx *jetflow.Context, in int) (int, error) {
	sum := in
	for i, name := range []string{"a", "b", "c"} {
		bodyStepCalls.Add(1)
		v, err := jetflow.Step(ctx, name, func(context.Context) (int, error) {
			if i == 2 {
				lastStepRan.call(ctx.RunID())
			}
			return i + 1, nil
		})
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
})

const e2eOutput = "6" // input 0 + 1 + 2 + 3

// admitWorkflow is only started, never served: no worker consumes its tasks.
var admitWorkflow = jetflow.NewWorkflow("bench_admit", func(_ *jetflow.Context, in int) (int, error) { return in, nil })

// engineE2E runs the end-to-end workload through jetflow.Start and a
// jetflow.Worker. With o.waitResults every start call (duplicates
// included) then waits for its run's result with Handle.Result and checks
// the output; otherwise completions are observed with one watcher on the
// runs bucket.
func engineE2E(ctx context.Context, e *env, cfg config, o e2eOpts) (s *e2eStats, err error) {
	wnc, err := e.conn(o.label + "-worker")
	if err != nil {
		return s, err
	}
	cnc, err := e.conn(o.label + "-client")
	if err != nil {
		return s, err
	}
	onc, err := e.conn(o.label + "-observer")
	if err != nil {
		return s, err
	}
	assets, err := jetstream.Provision(ctx, onc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return s, err
	}
	logs := &logCounter{}
	worker, err := startWorker(ctx, wnc, cfg, o.label+"-worker", logs, zerolog.InfoLevel, e2eWorkflow)
	if err != nil {
		return s, err
	}
	workerStopped := false
	stopWorker := func() error {
		if workerStopped {
			return nil
		}
		workerStopped = true
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return worker.Stop(sctx)
	}
	defer func() { _ = stopWorker() }()
	client, err := jetflow.NewClient(ctx, cnc, jetflow.ClientConfig{Name: "bench"})
	if err != nil {
		return s, err
	}

	w := newWorkload(o.label, o.runs, cfg.dupFrac, cfg.starters)
	t := newTracker(o.runs)
	calls := newCallTimes(o.runs)
	lastRan := make([]atomic.Int64, o.runs)
	defer lastStepRan.add(func(runID string) {
		if i, ok := w.index[runID]; ok {
			lastRan[i].CompareAndSwap(0, time.Now().UnixNano())
		}
	})()

	// Without waits for results, one watcher for every run: a run is
	// done when its record turns terminal.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if !o.waitResults {
		stop, err := watchCompletions(wctx, assets, w.index, t, func(r state.Run) bool { return r.Status == state.StatusCompleted })
		if err != nil {
			return s, err
		}
		defer stop()
	}

	streams := []string{jetstream.TasksStream, "KV_" + jetstream.RunsBucket, "KV_" + jetstream.StepsBucket, "KV_" + jetstream.AuditBucket}
	seqBefore, err := lastSeqs(ctx, assets.JS, streams...)
	if err != nil {
		return s, err
	}
	before := connStats(wnc, cnc)
	if o.tap != nil {
		o.tap.reset()
	}

	var created, dups, wrongResults atomic.Int64
	cpuBefore := processCPU()
	err = runStarters(ctx, w, t, cfg.starters, o.rate, func(ctx context.Context, run int) error {
		t0 := calls.begin(run)
		h, err := jetflow.Start(ctx, client, e2eWorkflow, 0, jetflow.WithRunID(w.ids[run]))
		if err != nil {
			return err
		}
		calls.end(run, t0, h.Outcome == jetflow.OutcomeCreated)
		if h.Outcome == jetflow.OutcomeCreated {
			created.Add(1)
		} else {
			dups.Add(1)
		}
		if !o.waitResults {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		out, err := h.Result(rctx)
		if err != nil {
			return fmt.Errorf("result: %w", err)
		}
		if strconv.Itoa(out) != e2eOutput {
			wrongResults.Add(1)
		}
		t.finished(run, strconv.Itoa(out) == e2eOutput)
		return nil
	})
	if err != nil {
		return s, err
	}
	waitErr := t.wait(ctx, cfg.timeout)
	cpu := processCPU() - cpuBefore
	s = t.summarize(stepsPerRun)
	s.cpuPerRun = cpu / time.Duration(o.runs)
	s.tracker = t
	s.calls = calls.summary()
	s.created, s.duplicates = created.Load(), dups.Load()
	after := connStats(wnc, cnc)
	s.msgsPerRun = float64(after-before) / float64(o.runs)
	if seqAfter, err := lastSeqs(ctx, assets.JS, streams...); err == nil {
		s.writesPerRun = float64(seqAfter-seqBefore) / float64(o.runs)
	}
	defer func() { s.extra = append(s.extra, logs.summary()...) }()
	if waitErr != nil {
		return s, waitErr
	}
	if n := wrongResults.Load(); n > 0 {
		return s, fmt.Errorf("%d results were not %s", n, e2eOutput)
	}
	if o.tap != nil {
		if s.ops, err = flushedOps(ctx, o.tap, wnc, cnc); err != nil {
			return s, err
		}
	}
	var lag []time.Duration
	for i := range o.runs {
		if a, b := lastRan[i].Load(), t.done[i].Load(); a != 0 && b != 0 {
			lag = append(lag, time.Duration(b-a))
		}
	}
	if len(lag) > 0 {
		slices.Sort(lag)
		s.extra = append(s.extra, fmt.Sprintf("jetflow last step body ran -> run seen completed by the %s: p50 %s, p99 %s, max %s",
			map[bool]string{false: "watcher", true: "waiting start call"}[o.waitResults],
			dur(lag[len(lag)/2]), dur(lag[min(len(lag)-1, len(lag)*99/100)]), dur(lag[len(lag)-1])))
	}
	if err := stopWorker(); err != nil {
		return s, fmt.Errorf("stop worker: %w", err)
	}
	stopWatch()
	return s, verifyE2E(ctx, assets, s, w)
}

// verifyE2E reads every run record of w back (each must be completed with
// the e2e output), reports the task stream's drain, and fails the pass
// unless every run completed and the starts' outcomes are the plan's.
func verifyE2E(ctx context.Context, assets *jetstream.Assets, s *e2eStats, w *workload) error {
	runs := len(w.ids)
	// Verify from the bucket, not only from the watch: every run ID has a
	// completed record with the expected output.
	var missing, notCompleted, wrongOutput atomic.Int64
	_, err := parallel(ctx, runs, 16, func(ctx context.Context, i int) error {
		v, _, err := assets.Runs.Get(ctx, w.ids[i])
		if errors.Is(err, jetstream.ErrNotFound) {
			missing.Add(1)
			return nil
		}
		if err != nil {
			return err
		}
		r, err := state.DecodeRun(v)
		if err != nil {
			return err
		}
		switch {
		case r.Status != state.StatusCompleted:
			notCompleted.Add(1)
		case string(r.Output) != e2eOutput:
			wrongOutput.Add(1)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	verified := int64(runs) - missing.Load() - notCompleted.Load() - wrongOutput.Load()
	s.extra = append(s.extra, fmt.Sprintf("jetflow verify: %d/%d run records completed with output %s (missing %d, not completed %d, wrong output %d)",
		verified, runs, e2eOutput, missing.Load(), notCompleted.Load(), wrongOutput.Load()))
	s.extra = append(s.extra, taskDrain(ctx, assets))
	if verified != int64(runs) {
		return fmt.Errorf("%d of %d runs verified in the bucket", verified, runs)
	}
	return checkStarts(s, runs, w.dups)
}

// startWorker starts an in-process jetflow.Worker named bench-<name> on
// nc, serving wf with cfg.concurrency slots and logging at level to logs.
func startWorker(ctx context.Context, nc *nats.Conn, cfg config, name string, logs *logCounter, level zerolog.Level, wf jetflow.Registrable) (*jetflow.Worker, error) {
	ws := jetflow.NewRegistry()
	if err := ws.Register(wf); err != nil {
		return nil, err
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Name: "bench-" + name, Concurrency: cfg.concurrency, Logger: zerolog.New(logs).Level(level),
	})
	if err != nil {
		return nil, err
	}
	return w, w.Start(ctx)
}

// taskDrain reports whether the workflow's task messages are all gone from
// the work-queue stream once every run completed. Acks are not confirmed by
// the server (no DoubleAck), so it may still be removing acknowledged tasks.
func taskDrain(ctx context.Context, assets *jetstream.Assets) string {
	filter := "jetflow.*." + e2eWorkflow.Name() + ".>"
	t0 := time.Now()
	for {
		info, err := assets.Tasks.Info(ctx, natsjs.WithSubjectFilter(filter))
		if err != nil {
			return "jetflow task stream: " + err.Error()
		}
		left := info.State.Msgs
		if left == 0 {
			return fmt.Sprintf("jetflow task stream: no task left (waited %s for acks to be applied)", dur(time.Since(t0)))
		}
		if time.Since(t0) > 10*time.Second || ctx.Err() != nil {
			kinds := map[string]int{}
			for subj := range info.State.Subjects {
				// jetflow.run.<wf>.<run> (a run task) or
				// jetflow.branch.<wf>.<run>.<step>.<n> (a branch task)
				if strings.HasPrefix(subj, "jetflow.run.") {
					kinds["run"]++
				} else {
					kinds["branch "+subj[strings.LastIndexByte(subj[:strings.LastIndexByte(subj, '.')], '.')+1:]]++
				}
			}
			return fmt.Sprintf("jetflow task stream: %d messages still there 10s after the worker stopped: %v", left, kinds)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// engineAdmission measures jetflow.Start alone: distinct run IDs, then the
// same IDs again (duplicates). No worker serves the workflow; its pending
// start tasks are purged afterwards.
func engineAdmission(ctx context.Context, e *env, cfg config, rep int) (distinct, dup float64, err error) {
	nc, err := e.conn("admit-client")
	if err != nil {
		return 0, 0, err
	}
	client, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{Name: "bench"})
	if err != nil {
		return 0, 0, err
	}
	assets, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		_ = assets.Tasks.Purge(context.WithoutCancel(ctx), natsjs.WithPurgeSubject(jetstream.RunSubject(admitWorkflow.Name(), ">")))
	}()
	id := func(i int) string { return "adm-" + strconv.Itoa(rep) + "-" + strconv.Itoa(i) }
	start := func(want jetflow.Outcome) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			h, err := jetflow.Start(ctx, client, admitWorkflow, i, jetflow.WithRunID(id(i)))
			if err != nil {
				return fmt.Errorf("start %s: %w", id(i), err)
			}
			if h.Outcome != want {
				return fmt.Errorf("start %s: outcome %s, want %s", id(i), h.Outcome, want)
			}
			return nil
		}
	}
	elapsed, err := parallel(ctx, cfg.admitN, cfg.admitG, start(jetflow.OutcomeCreated))
	if err != nil {
		return 0, 0, fmt.Errorf("distinct: %w", err)
	}
	distinct = float64(cfg.admitN) / elapsed.Seconds()
	elapsed, err = parallel(ctx, cfg.admitN, cfg.admitG, start(jetflow.OutcomeExisting))
	if err != nil {
		return 0, 0, fmt.Errorf("duplicates: %w", err)
	}
	dup = float64(cfg.admitN) / elapsed.Seconds()
	return distinct, dup, nil
}

// logCounter counts the worker's log lines by level and message, so that
// retries, releases and lost races show up in the report.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
	sample map[string]string
}

func (l *logCounter) Write(p []byte) (int, error) {
	var line struct {
		Level   string `json:"level"`
		Message string `json:"message"`
		Error   string `json:"error"`
	}
	_ = json.Unmarshal(p, &line)
	if line.Level == "info" && (line.Message == "worker started" || line.Message == "worker stopped") {
		return len(p), nil
	}
	key := line.Level + ": " + line.Message
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts, l.sample = make(map[string]int), make(map[string]string)
	}
	l.counts[key]++
	if line.Error != "" {
		l.sample[key] = line.Error
	}
	return len(p), nil
}

func (l *logCounter) summary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.counts))
	for k := range l.counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		line := fmt.Sprintf("jetflow worker log: %d x %s", l.counts[k], k)
		if e := l.sample[k]; e != "" {
			line += " (e.g. " + e + ")"
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		out = append(out, "jetflow worker log: no retries, releases or lost races")
	}
	return out
}
