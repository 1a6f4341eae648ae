package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// The raw reference programs use their own stream, buckets and consumer
// (bench_* names) on the same server as the engine, and delete them when
// done so that later phases start from the same state.

// payload sizes roughly matching the engine's task messages and records.
var (
	rawPayload = []byte(strings.Repeat("x", 128))
	rawValue   = []byte(strings.Repeat("v", 200))
)

// rawPublish: async publishes with distinct Nats-Msg-Id to a file stream,
// then waits for every ack.
func rawPublish(ctx context.Context, e *env, cfg config) (rate float64, err error) {
	nc, err := e.conn("raw-publish")
	if err != nil {
		return 0, err
	}
	var asyncErrs atomic.Int64
	var lastErr atomic.Value
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncErrHandler(func(_ natsjs.JetStream, _ *nats.Msg, err error) {
		asyncErrs.Add(1)
		lastErr.Store(err.Error())
	}))
	if err != nil {
		return 0, err
	}
	stream, err := js.CreateStream(ctx, natsjs.StreamConfig{
		Name: "BENCH_PUBLISH", Subjects: []string{"bench.publish.>"},
		Storage: natsjs.FileStorage, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return 0, fmt.Errorf("create stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), "BENCH_PUBLISH") }()

	t0 := time.Now()
	for i := range cfg.pubN {
		m := &nats.Msg{Subject: "bench.publish.x", Data: rawPayload}
		// The client keeps at most 4,000 publishes in flight (the default)
		// and blocks while the window is full, up to the stall wait.
		if _, err := js.PublishMsgAsync(m, natsjs.WithMsgID("p-"+strconv.Itoa(i)), natsjs.WithStallWait(cfg.timeout)); err != nil {
			return 0, fmt.Errorf("publish %d: %w", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(cfg.timeout):
		return 0, fmt.Errorf("acks still pending after %s: %d", cfg.timeout, js.PublishAsyncPending())
	}
	elapsed := time.Since(t0)
	if n := asyncErrs.Load(); n > 0 {
		return 0, fmt.Errorf("%d async publishes failed, last: %v", n, lastErr.Load())
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs != uint64(cfg.pubN) {
		return 0, fmt.Errorf("stream holds %d messages, published %d", info.State.Msgs, cfg.pubN)
	}
	return float64(cfg.pubN) / elapsed.Seconds(), nil
}

// rawKVCreate: KV Create of distinct keys from many goroutines.
func rawKVCreate(ctx context.Context, e *env, cfg config) (rate float64, err error) {
	nc, err := e.conn("raw-kv")
	if err != nil {
		return 0, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		return 0, err
	}
	kv, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: "bench_kv", History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return 0, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), "bench_kv") }()
	elapsed, err := parallel(ctx, cfg.kvN, cfg.kvG, func(ctx context.Context, i int) error {
		_, err := kv.Create(ctx, "k-"+strconv.Itoa(i), rawValue)
		return err
	})
	if err != nil {
		return 0, err
	}
	return float64(cfg.kvN) / elapsed.Seconds(), nil
}

const stepsPerRun = 3

// rawDesign is one of the two raw reference programs of the end-to-end
// workload; they share their stream, buckets and worker pool layout and
// differ in what a start and a step do.
type rawDesign struct {
	name  string // "mini" or "gated": names the stream, buckets, consumer and subjects
	gated bool
}

var (
	// miniDesign is the minimal program: start = publish the first task
	// (Nats-Msg-Id = run ID), then KV-create the run key; step = KV-create
	// the step result, publish the next task, ack. Nothing is read back.
	miniDesign = rawDesign{name: "mini"}
	// gatedDesign is the correct minimal design: start = KV-create the
	// run key, and only if that created it publish the first task; step =
	// read the step key (skip the effect if present), KV-create it,
	// publish the next task, ack. A run's result is its last step key,
	// seen by one shared watcher per process.
	gatedDesign = rawDesign{name: "gated", gated: true}
)

func (d rawDesign) stream() string  { return "BENCH_" + strings.ToUpper(d.name) }
func (d rawDesign) subject() string { return "bench." + d.name + "." }
func (d rawDesign) runsKV() string  { return "bench_" + d.name + "_runs" }
func (d rawDesign) stepsKV() string { return "bench_" + d.name + "_steps" }
func (d rawDesign) streams() []string {
	return []string{d.stream(), "KV_" + d.runsKV(), "KV_" + d.stepsKV()}
}

// resultKey is the step key that holds a raw run's result: its last step.
func resultKey(runID string) string { return runID + ".s" + strconv.Itoa(stepsPerRun) }

// rawProgram runs the end-to-end workload with design d, written plainly:
//
//   - start (mini): publish the run's first task (bench.mini.<run>.1) with
//     Nats-Msg-Id = run ID, then KV-create the run key (a duplicate start
//     gets a duplicate ack and ErrKeyExists);
//   - start (gated): KV-create the run key; only a start that created it
//     publishes the first task (Nats-Msg-Id = run ID), a duplicate gets
//     ErrKeyExists and publishes nothing;
//   - a pool of consumers pulls tasks from one durable consumer; for task k
//     it (gated only: reads the step key <run>.s<k> and skips the effect
//     when present) KV-creates the step result <run>.s<k>, publishes task
//     k+1 with Nats-Msg-Id <run>.<k+1> (for k < 3), and acks.
//
// A mini run is complete when its worker committed the last step result.
// A gated run is complete when the process's one watcher of the last step
// keys sees it; with o.waitResults every start call, duplicates included,
// then waits for its run's result through that watcher.
func rawProgram(ctx context.Context, e *env, cfg config, d rawDesign, o e2eOpts) (s *e2eStats, err error) {
	snc, err := e.conn(o.label + "-starter")
	if err != nil {
		return s, err
	}
	wnc, err := e.conn(o.label + "-worker")
	if err != nil {
		return s, err
	}
	sjs, err := natsjs.New(snc)
	if err != nil {
		return s, err
	}
	wjs, err := natsjs.New(wnc)
	if err != nil {
		return s, err
	}
	_, err = sjs.CreateStream(ctx, natsjs.StreamConfig{
		Name: d.stream(), Subjects: []string{d.subject() + ">"}, Retention: natsjs.WorkQueuePolicy,
		Storage: natsjs.FileStorage, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return s, fmt.Errorf("create stream: %w", err)
	}
	cleanup := context.WithoutCancel(ctx)
	defer func() { _ = sjs.DeleteStream(cleanup, d.stream()) }()
	runs, err := sjs.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: d.runsKV(), History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return s, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = sjs.DeleteKeyValue(cleanup, d.runsKV()) }()
	startSteps, err := sjs.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: d.stepsKV(), History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return s, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = sjs.DeleteKeyValue(cleanup, d.stepsKV()) }()
	steps, err := wjs.KeyValue(ctx, d.stepsKV())
	if err != nil {
		return s, err
	}
	cons, err := wjs.CreateOrUpdateConsumer(ctx, d.stream(), natsjs.ConsumerConfig{
		Durable: "bench_" + d.name, AckPolicy: natsjs.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxDeliver: -1, MaxAckPending: 64 * cfg.concurrency, DeliverPolicy: natsjs.DeliverAllPolicy,
	})
	if err != nil {
		return s, fmt.Errorf("create consumer: %w", err)
	}

	w := newWorkload(o.label, o.runs, cfg.dupFrac, cfg.starters)
	t := newTracker(o.runs)
	calls := newCallTimes(o.runs)
	var results *resultWaiters
	if d.gated {
		// One watcher of every run's result key for the whole process,
		// demultiplexed to the start calls that wait.
		results = newResultWaiters()
		wctx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		watcher, err := startSteps.Watch(wctx, "*.s"+strconv.Itoa(stepsPerRun), natsjs.UpdatesOnly())
		if err != nil {
			return s, fmt.Errorf("watch results: %w", err)
		}
		defer func() { _ = watcher.Stop() }()
		go forEachUpdate(wctx, watcher, func(ent natsjs.KeyValueEntry) {
			if ent.Operation() != natsjs.KeyValuePut {
				return
			}
			id := strings.TrimSuffix(ent.Key(), ".s"+strconv.Itoa(stepsPerRun))
			if i, ok := w.index[id]; ok {
				t.finished(i, true)
			}
			results.fire(id)
		})
	}

	// Worker pool: the consume callback hands each message to one of
	// cfg.concurrency goroutines, as the engine's pool does.
	var workerErrs atomic.Int64
	var lastWorkerErr atomic.Value
	fail := func(m natsjs.Msg, err error) {
		workerErrs.Add(1)
		lastWorkerErr.Store(err.Error())
		_ = m.NakWithDelay(100 * time.Millisecond)
	}
	handle := func(m natsjs.Msg) {
		// bench.<design>.<run>.<k>
		tok := strings.Split(m.Subject(), ".")
		if len(tok) != 4 {
			fail(m, fmt.Errorf("bad subject %q", m.Subject()))
			return
		}
		runID := tok[2]
		k, err := strconv.Atoi(tok[3])
		if err != nil {
			fail(m, err)
			return
		}
		key := runID + ".s" + tok[3]
		done := false
		if d.gated {
			_, err := steps.Get(ctx, key)
			switch {
			case err == nil:
				done = true // committed by an earlier delivery: skip the effect
			case !errors.Is(err, natsjs.ErrKeyNotFound):
				fail(m, fmt.Errorf("read step: %w", err))
				return
			}
		}
		if !done {
			if _, err := steps.Create(ctx, key, []byte(tok[3])); err != nil && !errors.Is(err, natsjs.ErrKeyExists) {
				fail(m, fmt.Errorf("commit step: %w", err))
				return
			}
		}
		if k < stepsPerRun {
			next := strconv.Itoa(k + 1)
			_, err := wjs.PublishMsg(ctx, &nats.Msg{Subject: d.subject() + runID + "." + next, Data: rawPayload},
				natsjs.WithMsgID(runID+"."+next))
			if err != nil {
				fail(m, fmt.Errorf("publish next task: %w", err))
				return
			}
		} else if i, ok := w.index[runID]; ok && !d.gated {
			t.finished(i, true)
		}
		if err := m.Ack(); err != nil {
			workerErrs.Add(1)
			lastWorkerErr.Store(err.Error())
		}
	}
	quit := make(chan struct{})
	work := make(chan natsjs.Msg)
	var wg sync.WaitGroup
	for range cfg.concurrency {
		wg.Go(func() {
			for {
				select {
				case <-quit:
					return
				case m := <-work:
					handle(m)
				}
			}
		})
	}
	cc, err := cons.Consume(func(m natsjs.Msg) {
		select {
		case work <- m:
		case <-quit:
		}
	}, natsjs.PullMaxMessages(cfg.concurrency))
	if err != nil {
		close(quit)
		wg.Wait()
		return s, fmt.Errorf("consume: %w", err)
	}
	defer func() {
		close(quit)
		cc.Stop()
		wg.Wait()
	}()

	before := connStats(snc, wnc)
	seqBefore, err := lastSeqs(ctx, sjs, d.streams()...)
	if err != nil {
		return s, err
	}
	if o.tap != nil {
		o.tap.reset()
	}
	var created, dups atomic.Int64
	startMini := func(ctx context.Context, id string) (bool, error) {
		if _, err := sjs.PublishMsg(ctx, &nats.Msg{Subject: d.subject() + id + ".1", Data: rawPayload}, natsjs.WithMsgID(id)); err != nil {
			return false, fmt.Errorf("publish start: %w", err)
		}
		_, err := runs.Create(ctx, id, rawValue)
		if errors.Is(err, natsjs.ErrKeyExists) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("create run key: %w", err)
		}
		return true, nil
	}
	startGated := func(ctx context.Context, id string) (bool, error) {
		_, err := runs.Create(ctx, id, rawValue)
		if errors.Is(err, natsjs.ErrKeyExists) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("create run key: %w", err)
		}
		if _, err := sjs.PublishMsg(ctx, &nats.Msg{Subject: d.subject() + id + ".1", Data: rawPayload}, natsjs.WithMsgID(id)); err != nil {
			return false, fmt.Errorf("publish start: %w", err)
		}
		return true, nil
	}
	start := startMini
	if d.gated {
		start = startGated
	}
	cpuBefore := processCPU()
	err = runStarters(ctx, w, t, cfg.starters, o.rate, func(ctx context.Context, run int) error {
		id := w.ids[run]
		var result <-chan struct{}
		if o.waitResults {
			// Registered before the start: a created run cannot end
			// before its waiter is there.
			result = results.add(id)
		}
		t0 := calls.begin(run)
		isNew, err := start(ctx, id)
		if err != nil {
			return err
		}
		calls.end(run, t0, isNew)
		if isNew {
			created.Add(1)
		} else {
			dups.Add(1)
		}
		if result == nil {
			return nil
		}
		if !isNew {
			// The run may have ended before this waiter was registered.
			_, err := startSteps.Get(ctx, resultKey(id))
			switch {
			case err == nil:
				results.fire(id)
			case !errors.Is(err, natsjs.ErrKeyNotFound):
				return fmt.Errorf("read result: %w", err)
			}
		}
		return awaitResult(ctx, result, cfg.timeout)
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
	after := connStats(snc, wnc)
	s.msgsPerRun = float64(after-before) / float64(o.runs)
	if seqAfter, err := lastSeqs(ctx, sjs, d.streams()...); err == nil {
		s.writesPerRun = float64(seqAfter-seqBefore) / float64(o.runs)
	}
	if waitErr != nil {
		return s, waitErr
	}
	if o.tap != nil {
		if s.ops, err = flushedOps(ctx, o.tap, snc, wnc); err != nil {
			return s, err
		}
	}
	if n := workerErrs.Load(); n > 0 {
		s.extra = append(s.extra, fmt.Sprintf("%s program: %d task errors (retried), last: %v", d.name, n, lastWorkerErr.Load()))
	}
	return s, checkStarts(s, o.runs, w.dups)
}

// checkStarts fails a pass unless every run completed, exactly one start
// of each run created it and every other one was a duplicate.
func checkStarts(s *e2eStats, runs, dups int) error {
	switch {
	case s.failed > 0:
		return fmt.Errorf("%d runs failed", s.failed)
	case s.completed != int64(runs):
		return fmt.Errorf("%d of %d runs completed", s.completed, runs)
	case s.created != int64(runs) || s.duplicates != int64(dups):
		return fmt.Errorf("%d starts created a run (want %d), %d were duplicates (want %d)", s.created, runs, s.duplicates, dups)
	}
	return nil
}

// connStats is the number of messages the connections sent to the server
// (publishes, requests, acks, pull requests).
func connStats(ncs ...*nats.Conn) uint64 {
	var n uint64
	for _, nc := range ncs {
		n += nc.Stats().OutMsgs
	}
	return n
}

// lastSeqs sums the last sequence of streams: the number of messages ever
// stored in them.
func lastSeqs(ctx context.Context, js natsjs.JetStream, streams ...string) (uint64, error) {
	var n uint64
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += info.State.LastSeq
	}
	return n, nil
}
