package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The fanout and deep phases measure two run shapes against runs of the
// 3-step e2e workflow, in the same phase, on the same worker settings:
//
//   - fanout: 1 step, then --fanout-width (32) steps started with jetflow.Go
//     and awaited with jetflow.AwaitAll, then 1 step;
//   - deep: --deep-steps (200) sequential steps in one run.
//
// Each repetition of a phase makes three kinds of pass (passes run one
// after the other, each with a fresh worker that is stopped at its end):
//
//  1. throughput: the shape's runs, then as many 3-step runs as give the
//     same number of steps: wall time, steps/s, the process's CPU time per
//     step (client, worker and the in-process server together), client
//     messages sent and stored writes per step (as the e2e phase counts
//     them);
//  2. operations: a few runs of each kind again with a tap connection
//     subscribed to every subject, which counts what the client and the
//     worker send by kind (task publishes, KV reads and writes per bucket,
//     acks, pull requests). The tap costs the server a copy of every
//     message, so it is not on during the throughput passes.
//
// The fanout phase counts operations at width 1 as well: the difference
// to width 32, divided by 31, is what one parallel branch costs.

// bodyStepCalls counts the Step and Go calls the bench's workflow bodies
// make, on every replay: a body is run from the top by every task of its
// run, so a run of n sequential steps makes n(n+1)/2 of them.
var bodyStepCalls atomic.Int64

// fanoutWorkflow runs 1 step, input parallel steps, 1 step; its output is
// 1 + 1 + 2 + ... + input.
var fanoutWorkflow = jetflow.NewWorkflow("bench_fanout", func(ctx *jetflow.Context, width int) (int, error) {
	bodyStepCalls.Add(1)
	first, err := jetflow.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		return 0, err
	}
	fs := make([]*jetflow.Future[int], width)
	aw := make([]jetflow.Awaitable, width)
	for i := range width {
		bodyStepCalls.Add(1)
		fs[i] = jetflow.Go(ctx, "branch", func(context.Context) (int, error) { return i + 1, nil })
		aw[i] = fs[i]
	}
	if err := jetflow.AwaitAll(ctx, aw...); err != nil {
		return 0, err
	}
	sum := first
	for _, f := range fs {
		v, err := f.Get(ctx)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	bodyStepCalls.Add(1)
	return jetflow.Step(ctx, "last", func(context.Context) (int, error) { return sum, nil })
})

func fanoutOutput(width int) int { return 1 + width*(width+1)/2 }

// deepStepRan, when set, is called by every step body of deepWorkflow with
// the run ID and the step's index.
var deepStepRan atomic.Pointer[func(runID string, i int)]

// deepWorkflow runs input sequential steps; its output is 1 + 2 + ... + input.
var deepWorkflow = jetflow.NewWorkflow("bench_deep", func(ctx *jetflow.Context, n int) (int, error) {
	sum := 0
	for i := range n {
		bodyStepCalls.Add(1)
		v, err := jetflow.Step(ctx, "s", func(context.Context) (int, error) {
			if h := deepStepRan.Load(); h != nil {
				(*h)(ctx.RunID(), i)
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

func deepOutput(n int) int { return n * (n + 1) / 2 }

// shape is one kind of run a pass starts.
type shape struct {
	label  string
	wf     *jetflow.Workflow[int, int]
	input  int
	steps  int // steps per run
	output int // the run's expected output
}

func e2eShape() shape {
	return shape{label: "3-step", wf: e2eWorkflow, input: 0, steps: stepsPerRun, output: 6}
}

func fanoutShape(width int) shape {
	return shape{label: "fanout-" + strconv.Itoa(width), wf: fanoutWorkflow, input: width, steps: width + 2, output: fanoutOutput(width)}
}

func deepShape(n int) shape {
	return shape{label: "deep-" + strconv.Itoa(n), wf: deepWorkflow, input: n, steps: n, output: deepOutput(n)}
}

// passStats is what one pass measured.
type passStats struct {
	runs, steps int
	elapsed     time.Duration // first start call to last completion
	cpu         time.Duration // process CPU time (user+system) over the same span
	msgs        uint64        // messages the client and worker connections sent
	writes      uint64        // messages stored in the task stream, runs, steps and audit buckets
	ops         opCounts      // with the tap only
	bodyCalls   int64         // Step and Go calls the bodies made (bodyStepCalls)
	logs        []string      // the worker's warnings, summarised
}

func (p passStats) stepsPerSec() float64 { return float64(p.steps) / p.elapsed.Seconds() }
func (p passStats) runsPerSec() float64  { return float64(p.runs) / p.elapsed.Seconds() }

// perStep divides a pass total by its steps.
func (p passStats) perStep(v float64) float64 { return v / float64(p.steps) }

// runPass starts runs runs of sh from starters goroutines on fresh workers
// (--shape-workers, each with --concurrency slots, in this process) and
// waits until every one is seen completed, then stops the workers and
// checks every run record. With a tap, it counts what the connections sent
// from the first start to the worker's stop.
func runPass(ctx context.Context, e *env, cfg config, prefix string, sh shape, runs, starters int, tp *tap) (p passStats, err error) {
	cnc, err := e.conn(prefix + "-client")
	if err != nil {
		return p, err
	}
	assets, err := jetstream.Provision(ctx, cnc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return p, err
	}
	logs := &logCounter{}
	conns := []*nats.Conn{cnc}
	var workers []*jetflow.Worker
	stopped := false
	stopWorkers := func() error {
		if stopped {
			return nil
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		var errs []error
		for _, w := range workers {
			errs = append(errs, w.Stop(sctx))
		}
		return errors.Join(errs...)
	}
	defer func() {
		if serr := stopWorkers(); serr != nil && err == nil {
			err = fmt.Errorf("stop worker: %w", serr)
		}
		p.logs = logs.summary()
	}()
	for i := range max(1, cfg.shapeWorkers) {
		name := prefix + "-worker-" + strconv.Itoa(i)
		wnc, err := e.conn(name)
		if err != nil {
			return p, err
		}
		conns = append(conns, wnc)
		worker, err := startWorker(ctx, wnc, cfg, name, logs, zerolog.WarnLevel, sh.wf)
		if err != nil {
			return p, err
		}
		workers = append(workers, worker)
	}
	client, err := jetflow.NewClient(ctx, cnc, jetflow.ClientConfig{Name: "bench"})
	if err != nil {
		return p, err
	}

	ids := make([]string, runs)
	index := make(map[string]int, runs)
	for i := range ids {
		ids[i] = prefix + "-" + strconv.Itoa(i)
		index[ids[i]] = i
	}
	t := newTracker(runs)
	stopWatch, err := watchCompletions(ctx, assets, index, t, func(r state.Run) bool { return r.Status == state.StatusCompleted })
	if err != nil {
		return p, err
	}
	defer stopWatch()

	streams := []string{jetstream.TasksStream, "KV_" + jetstream.RunsBucket, "KV_" + jetstream.StepsBucket, "KV_" + jetstream.AuditBucket}
	seqBefore, err := lastSeqs(ctx, assets.JS, streams...)
	if err != nil {
		return p, err
	}
	msgsBefore := connStats(conns...)
	if tp != nil {
		tp.reset()
	}
	cpuBefore, callsBefore := processCPU(), bodyStepCalls.Load()
	_, err = parallel(ctx, runs, starters, func(ctx context.Context, i int) error {
		t.started(i)
		_, err := jetflow.Start(ctx, client, sh.wf, sh.input, jetflow.WithRunID(ids[i]))
		return err
	})
	if err != nil {
		return p, err
	}
	if err := t.wait(ctx, cfg.timeout); err != nil {
		return p, err
	}
	p.cpu, p.bodyCalls = processCPU()-cpuBefore, bodyStepCalls.Load()-callsBefore
	s := t.summarize(sh.steps)
	p.runs, p.steps, p.elapsed = s.runs, s.steps, s.elapsed
	if err := stopWorkers(); err != nil {
		return p, fmt.Errorf("stop worker: %w", err)
	}
	p.msgs = connStats(conns...) - msgsBefore
	seqAfter, err := lastSeqs(ctx, assets.JS, streams...)
	if err != nil {
		return p, err
	}
	p.writes = seqAfter - seqBefore
	if tp != nil {
		if p.ops, err = flushedOps(ctx, tp, conns...); err != nil {
			return p, err
		}
	}
	if t.failed.Load() > 0 {
		return p, fmt.Errorf("%s: %d runs did not complete", sh.label, t.failed.Load())
	}
	return p, verifyRuns(ctx, assets, ids, strconv.Itoa(sh.output))
}

// watchCompletions marks run index[key] finished in t when its record in
// the runs bucket turns terminal, a success when ok says so of the record.
// The returned function stops the watch.
func watchCompletions(ctx context.Context, assets *jetstream.Assets, index map[string]int, t *tracker, ok func(state.Run) bool) (func(), error) {
	wctx, cancel := context.WithCancel(ctx)
	watcher, err := assets.Runs.Raw().WatchAll(wctx, natsjs.UpdatesOnly())
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch runs: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		forEachUpdate(wctx, watcher, func(ent natsjs.KeyValueEntry) {
			i, known := index[ent.Key()]
			if !known {
				return
			}
			if r, err := state.DecodeRun(ent.Value()); err == nil && r.Status.Terminal() {
				t.finished(i, ok(r))
			}
		})
	})
	return func() { cancel(); _ = watcher.Stop(); wg.Wait() }, nil
}

// forEachUpdate calls fn with each entry watcher delivers (not the nil
// that marks the end of the initial values) until the watcher closes or
// ctx ends.
func forEachUpdate(ctx context.Context, watcher natsjs.KeyWatcher, fn func(natsjs.KeyValueEntry)) {
	for {
		select {
		case ent, ok := <-watcher.Updates():
			if !ok {
				return
			}
			if ent != nil {
				fn(ent)
			}
		case <-ctx.Done():
			return
		}
	}
}

// verifyRuns reads every run record back: each must be completed with
// output want.
func verifyRuns(ctx context.Context, assets *jetstream.Assets, ids []string, want string) error {
	var bad atomic.Int64
	var sample atomic.Value
	_, err := parallel(ctx, len(ids), 16, func(ctx context.Context, i int) error {
		v, _, err := assets.Runs.Get(ctx, ids[i])
		if err != nil {
			return err
		}
		r, err := state.DecodeRun(v)
		if err != nil {
			return err
		}
		if r.Status != state.StatusCompleted || string(r.Output) != want {
			bad.Add(1)
			sample.Store(fmt.Sprintf("%s: %s with output %s", ids[i], r.Status, r.Output))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if n := bad.Load(); n > 0 {
		return fmt.Errorf("verify: %d of %d runs not completed with output %s (e.g. %v)", n, len(ids), want, sample.Load())
	}
	return nil
}

// processCPU is the user and system CPU time this process has used: the
// client, the worker and the embedded server together.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// opCounts counts messages sent to the server by kind, over a pass.
type opCounts map[string]float64

// Op kinds the reports show. KV reads and writes are counted per bucket
// too, as "kv read <bucket>" and "kv write <bucket>".
const (
	opTask  = "task publish"
	opRead  = "kv read"
	opWrite = "kv write"
	opAck   = "ack"
	opPull  = "pull request"
	opAPI   = "other JetStream API"
	opOther = "other"
	// opDelivery is not sent by a client: it is a message a consumer
	// delivered (tasks to the worker, run records to watchers).
	opDelivery = "consumer delivery"
	opTotal    = "total client msgs"
)

// scale divides every count by n.
func (o opCounts) scale(n float64) opCounts {
	out := make(opCounts, len(o))
	for k, v := range o {
		out[k] = v / n
	}
	return out
}

// tap counts every message on the server by kind, from one connection
// subscribed to ">". Replies to inboxes are not counted: they are the
// server's answers, not operations the engine sent. Consumer deliveries
// are counted apart.
type tap struct {
	mu     sync.Mutex
	counts opCounts
	marker chan struct{}
	nc     *nats.Conn
}

const tapMarker = "bench.tap.marker"

func newTap(e *env) (*tap, error) {
	nc, err := e.conn("tap")
	if err != nil {
		return nil, err
	}
	tp := &tap{counts: opCounts{}, marker: make(chan struct{}, 1), nc: nc}
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, "$JS.ACK.") {
			// A consumer's delivery: the server sends it to the
			// consumer's inbox, which ">" matches, under the stored
			// message's subject.
			tp.add(opDelivery, "")
			return
		}
		tp.count(m.Subject)
	})
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	return tp, nc.Flush()
}

func (tp *tap) count(subject string) {
	kind, bucket := classify(subject)
	if kind == tapMarker {
		select {
		case tp.marker <- struct{}{}:
		default:
		}
		return
	}
	if kind != "" {
		tp.add(kind, bucket)
	}
}

// add counts one message of kind (on bucket, if any); every kind but
// deliveries counts towards the total the clients sent.
func (tp *tap) add(kind, bucket string) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.counts[kind]++
	if kind != opDelivery {
		tp.counts[opTotal]++
	}
	if bucket != "" {
		tp.counts[kind+" "+bucket]++
	}
}

// classify names the kind of a message by its subject, and the KV bucket
// it reads or writes; "" for what is not counted.
func classify(subject string) (kind, bucket string) {
	cut := func(prefix string) (string, bool) {
		if len(subject) < len(prefix) || subject[:len(prefix)] != prefix {
			return "", false
		}
		return subject[len(prefix):], true
	}
	upTo := func(s string) string {
		for i := range len(s) {
			if s[i] == '.' {
				return s[:i]
			}
		}
		return s
	}
	if rest, ok := cut("$JS.API.DIRECT.GET.KV_"); ok {
		return opRead, upTo(rest)
	}
	if rest, ok := cut("$JS.API.STREAM.MSG.GET.KV_"); ok {
		return opRead, upTo(rest)
	}
	if rest, ok := cut("$KV."); ok {
		return opWrite, upTo(rest)
	}
	for _, prefix := range []string{"jetflow.run.", "jetflow.branch.", "jetflow.task."} {
		if _, ok := cut(prefix); ok {
			return opTask, ""
		}
	}
	if _, ok := cut("bench.gated."); ok {
		return opTask, "" // the gated program's tasks
	}
	if _, ok := cut("$JS.ACK."); ok {
		return opAck, ""
	}
	if _, ok := cut("$JS.API.CONSUMER.MSG.NEXT."); ok {
		return opPull, ""
	}
	if _, ok := cut("$JS.API."); ok {
		return opAPI, ""
	}
	if _, ok := cut("_INBOX."); ok {
		return "", ""
	}
	if _, ok := cut("$JS.EVENT."); ok {
		// The server's own advisories (an API call's audit, a consumer
		// created), which may arrive after the pass that caused them.
		return "", ""
	}
	if subject == tapMarker {
		return tapMarker, ""
	}
	return opOther, ""
}

// close unsubscribes the tap (its connection closes): every later phase
// would otherwise pay for its copies.
func (tp *tap) close() { tp.nc.Close() }

func (tp *tap) reset() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.counts = opCounts{}
}

// snapshot returns the counts once the tap has seen everything the server
// handled before this call: its own marker comes after all of it.
func (tp *tap) snapshot(ctx context.Context) (opCounts, error) {
	select {
	case <-tp.marker:
	default:
	}
	if err := tp.nc.Publish(tapMarker, nil); err != nil {
		return nil, err
	}
	if err := tp.nc.Flush(); err != nil {
		return nil, err
	}
	select {
	case <-tp.marker:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, errors.New("tap: marker not seen within 30s")
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	out := make(opCounts, len(tp.counts))
	for k, v := range tp.counts {
		out[k] = v
	}
	return out, nil
}
