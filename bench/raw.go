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

const (
	miniStream  = "BENCH_MINI"
	miniRuns    = "bench_mini_runs"
	miniSteps   = "bench_mini_steps"
	stepsPerRun = 3
)

// rawMinimal is the smallest JetStream program that runs the end-to-end
// workload durably, written plainly:
//
//   - start: publish the run's first task (bench.mini.<run>.1) with
//     Nats-Msg-Id = run ID, then KV-create the run key (a duplicate start
//     gets a duplicate ack and ErrKeyExists);
//   - a pool of consumers pulls tasks from one durable consumer; for task k
//     it KV-creates the step result <run>.s<k>, publishes task k+1 with
//     Nats-Msg-Id <run>.<k+1> (for k < 3), and acks.
//
// The run is complete when its last step result is committed. Nothing is
// read back: no run record update, no history replay, no duplicate audit.
func rawMinimal(ctx context.Context, e *env, cfg config, rep int) (s *e2eStats, err error) {
	snc, err := e.conn("mini-starter")
	if err != nil {
		return s, err
	}
	wnc, err := e.conn("mini-worker")
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
		Name: miniStream, Subjects: []string{"bench.mini.>"}, Retention: natsjs.WorkQueuePolicy,
		Storage: natsjs.FileStorage, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return s, fmt.Errorf("create stream: %w", err)
	}
	cleanup := context.WithoutCancel(ctx)
	defer func() { _ = sjs.DeleteStream(cleanup, miniStream) }()
	runs, err := sjs.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: miniRuns, History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return s, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = sjs.DeleteKeyValue(cleanup, miniRuns) }()
	if _, err := sjs.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: miniSteps, History: 1, Storage: natsjs.FileStorage}); err != nil {
		return s, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = sjs.DeleteKeyValue(cleanup, miniSteps) }()
	steps, err := wjs.KeyValue(ctx, miniSteps)
	if err != nil {
		return s, err
	}
	cons, err := wjs.CreateOrUpdateConsumer(ctx, miniStream, natsjs.ConsumerConfig{
		Durable: "bench_mini", AckPolicy: natsjs.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxDeliver: -1, MaxAckPending: 64 * cfg.concurrency, DeliverPolicy: natsjs.DeliverAllPolicy,
	})
	if err != nil {
		return s, fmt.Errorf("create consumer: %w", err)
	}

	w := newWorkload("mini-"+strconv.Itoa(rep), cfg.runs, cfg.dupFrac, cfg.starters)
	t := newTracker(cfg.runs)

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
		// bench.mini.<run>.<k>
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
		if _, err := steps.Create(ctx, runID+".s"+tok[3], []byte(tok[3])); err != nil && !errors.Is(err, natsjs.ErrKeyExists) {
			fail(m, fmt.Errorf("commit step: %w", err))
			return
		}
		if k < stepsPerRun {
			next := strconv.Itoa(k + 1)
			_, err := wjs.PublishMsg(ctx, &nats.Msg{Subject: "bench.mini." + runID + "." + next, Data: rawPayload},
				natsjs.WithMsgID(runID+"."+next))
			if err != nil {
				fail(m, fmt.Errorf("publish next task: %w", err))
				return
			}
		} else if i, ok := w.index[runID]; ok {
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
	seqBefore, err := lastSeqs(ctx, sjs, miniStream, "KV_"+miniRuns, "KV_"+miniSteps)
	if err != nil {
		return s, err
	}
	var created, dups atomic.Int64
	err = runStarters(ctx, w, t, cfg.starters, cfg.startRate, func(ctx context.Context, run int) error {
		id := w.ids[run]
		if _, err := sjs.PublishMsg(ctx, &nats.Msg{Subject: "bench.mini." + id + ".1", Data: rawPayload}, natsjs.WithMsgID(id)); err != nil {
			return fmt.Errorf("publish start: %w", err)
		}
		_, err := runs.Create(ctx, id, rawValue)
		switch {
		case err == nil:
			created.Add(1)
		case errors.Is(err, natsjs.ErrKeyExists):
			dups.Add(1)
		default:
			return fmt.Errorf("create run key: %w", err)
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	waitErr := t.wait(ctx, cfg.timeout)
	s = t.summarize(stepsPerRun)
	s.tracker = t
	s.created, s.duplicates = created.Load(), dups.Load()
	after := connStats(snc, wnc)
	s.msgsPerRun = float64(after-before) / float64(cfg.runs)
	if seqAfter, err := lastSeqs(ctx, sjs, miniStream, "KV_"+miniRuns, "KV_"+miniSteps); err == nil {
		s.writesPerRun = float64(seqAfter-seqBefore) / float64(cfg.runs)
	}
	if waitErr != nil {
		return s, waitErr
	}
	if n := workerErrs.Load(); n > 0 {
		s.extra = append(s.extra, fmt.Sprintf("minimal program: %d task errors (retried), last: %v", n, lastWorkerErr.Load()))
	}
	switch {
	case s.completed != int64(cfg.runs):
		return s, fmt.Errorf("%d of %d runs completed", s.completed, cfg.runs)
	case s.created != int64(cfg.runs) || s.duplicates != int64(w.dups):
		return s, fmt.Errorf("%d starts created a run (want %d), %d were duplicates (want %d)", s.created, cfg.runs, s.duplicates, w.dups)
	}
	return s, nil
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
