package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
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

// The sleepers, wakeups and events phases measure durable sleeps and event
// deliveries against plain JetStream on the same server:
//
//   - sleepers: --sleepers runs each reach a long Sleep (--sleep, 1h) after
//     one step. The worker is a process of its own (this binary re-executed
//     with waitsWorkerEnv set), so that its memory, goroutines and CPU are
//     its own and not the in-process server's: they are read idle, before
//     any run, and again while every run sleeps, and must stay flat. The
//     broker storage the runs added (every stream and bucket) is divided by
//     the runs, next to the storage of as many plain scheduled messages,
//     and the rate at which runs reach their sleep next to the raw rate of
//     publishing scheduled messages.
//   - wakeups: --wakeups runs sleep until one common due time
//     (SleepUntil); wake-ups/s from the due time to the last completion,
//     and the lateness of each run's completion, next to as many plain
//     scheduled messages due at once and consumed by a plain consumer.
//   - events: --events runs wait on WaitEvent; Client.SendEvent from
//     --starters goroutines delivers one event to each, --dup-frac of them
//     sent twice; the outcomes must be exactly the plan's (delivered once
//     per run, duplicate for every repeat). Next to a plain request-reply
//     responder that KV-creates each event ID, on the same plan.

const (
	// waitsWorkerEnv, set to a NATS URL, makes this binary (or the bench
	// test binary) a waits worker process instead of the bench.
	waitsWorkerEnv = "JETFLOW_BENCH_WAITS_WORKER"
	// waitsConcurrencyEnv is the worker process's concurrency.
	waitsConcurrencyEnv = "JETFLOW_BENCH_WAITS_CONCURRENCY"
	// waitsStuckAfterEnv is the worker process's WorkerConfig.StuckAfter
	// (a Go duration; empty: the default).
	waitsStuckAfterEnv = "JETFLOW_BENCH_WAITS_STUCK_AFTER"
	// waitsStatsSubject is where the worker process answers with its
	// procStats.
	waitsStatsSubject = "bench.waits.stats"
	// eventName is the event bench_event runs wait for.
	eventName = "go"
	// eventPayload is every event's payload, and so every bench_event
	// run's output.
	eventPayload = "7"
)

// sleepWorkflow runs one step, then sleeps for its input in seconds.
var sleepWorkflow = jetflow.NewWorkflow("bench_sleep", func(ctx *jetflow.Context, seconds int) (int, error) {
	v, err := jetflow.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		return 0, err
	}
	return v, jetflow.Sleep(ctx, "nap", time.Duration(seconds)*time.Second)
})

// wakeWorkflow runs one step, then sleeps until its input (Unix ms).
var wakeWorkflow = jetflow.NewWorkflow("bench_wake", func(ctx *jetflow.Context, dueMilli int64) (int, error) {
	v, err := jetflow.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		return 0, err
	}
	return v, jetflow.SleepUntil(ctx, "nap", time.UnixMilli(dueMilli))
})

// eventWorkflow waits for the event "go", runs a step that returns its
// payload, then sleeps for its input in seconds: the run stays alive, so
// that an event ID sent again is a duplicate, not a send to an ended run.
var eventWorkflow = jetflow.NewWorkflow("bench_event", func(ctx *jetflow.Context, holdSeconds int) (int, error) {
	ev, err := jetflow.WaitEvent[int](ctx, eventName)
	if err != nil {
		return 0, err
	}
	v, err := jetflow.Step(ctx, eventStep, func(context.Context) (int, error) { return ev, nil })
	if err != nil {
		return 0, err
	}
	return v, jetflow.Sleep(ctx, "hold", time.Duration(holdSeconds)*time.Second)
}, jetflow.WithEvent[int](eventName))

// eventStep is the step a bench_event run runs once its event came.
const eventStep = "after"

// waitsWorkerMain runs the waits worker process when waitsWorkerEnv is set
// and reports so, with the process's exit code; otherwise it does nothing.
func waitsWorkerMain() (bool, int) {
	url := os.Getenv(waitsWorkerEnv)
	if url == "" {
		return false, 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runWaitsWorker(ctx, url); err != nil {
		fmt.Fprintln(os.Stderr, "bench waits worker:", err)
		return true, 1
	}
	return true, 0
}

// runWaitsWorker serves the three workflows, and answers on
// waitsStatsSubject with its procStats, until ctx ends.
func runWaitsWorker(ctx context.Context, url string) error {
	concurrency, err := strconv.Atoi(os.Getenv(waitsConcurrencyEnv))
	if err != nil || concurrency < 1 {
		return fmt.Errorf("%s=%q: want a positive count", waitsConcurrencyEnv, os.Getenv(waitsConcurrencyEnv))
	}
	var stuckAfter time.Duration
	if v := os.Getenv(waitsStuckAfterEnv); v != "" {
		if stuckAfter, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("%s: %w", waitsStuckAfterEnv, err)
		}
	}
	nc, err := jetstream.Connect(url, "bench-waits-worker")
	if err != nil {
		return err
	}
	defer nc.Close()
	ws := jetflow.NewRegistry()
	if err := ws.Register(sleepWorkflow, wakeWorkflow, eventWorkflow, backlogWorkflow); err != nil {
		return err
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Name: "bench-waits-worker", Concurrency: concurrency, StuckAfter: stuckAfter,
		Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	sub, err := nc.Subscribe(waitsStatsSubject, func(m *nats.Msg) {
		s := readProcStats()
		if path := string(m.Data); path != "" {
			s.ProfileErr = writeHeapProfile(path)
		}
		b, err := json.Marshal(s)
		if err != nil {
			b = []byte(`{}`)
		}
		_ = m.Respond(b)
	})
	if err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.Stop(sctx)
}

// procStats is what a process holds and has spent.
type procStats struct {
	Goroutines int           `json:"goroutines"`
	HeapAlloc  uint64        `json:"heap_alloc"` // live Go heap after a GC
	RSS        uint64        `json:"rss"`        // after a GC that returned freed memory to the OS
	PeakRSS    uint64        `json:"peak_rss"`   // the process's highest RSS so far
	CPU        time.Duration `json:"cpu"`        // user+system since the process started, read before the GC
	// ProfileErr is why a heap profile asked for could not be written.
	ProfileErr string `json:"profile_err,omitempty"`
}

// writeHeapProfile writes the process's heap profile (as of the last GC)
// to path; "" when it did.
func writeHeapProfile(path string) string {
	f, err := os.Create(path)
	if err != nil {
		return err.Error()
	}
	err = pprof.Lookup("heap").WriteTo(f, 0)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// readProcStats reads this process's procStats. It collects garbage and
// returns freed memory to the OS first, so that RSS and heap are what is
// held, not what the last burst left behind.
func readProcStats() procStats {
	s := procStats{CPU: processCPU()}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.HeapAlloc, s.Goroutines = ms.HeapAlloc, runtime.NumGoroutine()
	s.RSS, s.PeakRSS = procStatus()
	return s
}

// procStatus reads VmRSS and VmHWM (bytes) from /proc/self/status; 0 where
// there is none.
func procStatus() (rss, peak uint64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		if name == "VmRSS" {
			rss = kb * 1024
		} else {
			peak = kb * 1024
		}
	}
	return rss, peak
}

// waitsWorker is a running waits worker process.
type waitsWorker struct {
	cmd  *exec.Cmd
	nc   *nats.Conn
	logs *logCounter
	done chan error
}

// spawnWaitsWorker starts a waits worker process on e's server and returns
// once it answers a stats request.
func spawnWaitsWorker(ctx context.Context, e *env, cfg config, name string) (*waitsWorker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	nc, err := e.conn(name + "-stats")
	if err != nil {
		return nil, err
	}
	w := &waitsWorker{nc: nc, logs: &logCounter{}, done: make(chan error, 1)}
	w.cmd = exec.Command(exe)
	w.cmd.Env = append(os.Environ(), waitsWorkerEnv+"="+e.srv.ClientURL(), waitsConcurrencyEnv+"="+strconv.Itoa(cfg.concurrency))
	if cfg.workerStuckAfter > 0 {
		w.cmd.Env = append(w.cmd.Env, waitsStuckAfterEnv+"="+cfg.workerStuckAfter.String())
	}
	w.cmd.Stderr = &lineWriter{w: w.logs}
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start waits worker process: %w", err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := w.stats(ctx, ""); err == nil {
			return w, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			_ = w.stop()
			return nil, fmt.Errorf("waits worker process not answering: %w", err)
		}
		select {
		case err := <-w.done:
			return nil, fmt.Errorf("waits worker process exited: %v; %s", err, strings.Join(w.logs.summary(), "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stats asks the worker process for its procStats, and to write its heap
// profile to profile unless that is "".
func (w *waitsWorker) stats(ctx context.Context, profile string) (procStats, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var s procStats
	m, err := w.nc.RequestWithContext(rctx, waitsStatsSubject, []byte(profile))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(m.Data, &s); err != nil {
		return s, err
	}
	if s.ProfileErr != "" {
		return s, fmt.Errorf("worker heap profile: %s", s.ProfileErr)
	}
	return s, nil
}

// stop ends the worker process (SIGTERM: it stops its worker) and waits
// for it; it is killed if it has not exited within a minute.
func (w *waitsWorker) stop() error {
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-w.done:
		return err
	case <-time.After(time.Minute):
		_ = w.cmd.Process.Kill()
		return errors.Join(errors.New("waits worker process did not stop within a minute: killed"), <-w.done)
	}
}

// lineWriter hands w one line at a time (logCounter decodes one JSON log
// line per Write).
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	w   io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if _, err := l.w.Write(l.buf[:i+1]); err != nil {
			return len(p), err
		}
		l.buf = l.buf[i+1:]
	}
}

// waitsClient opens a client connection with the engine's assets.
// openWaitsPhase opens what each waits phase runs on: a client (with the
// engine's assets) and a worker process of its own, both named after
// phase. The caller defers the worker's close.
func openWaitsPhase(ctx context.Context, e *env, cfg config, phase string) (*jetflow.Client, *jetstream.Assets, *waitsWorker, error) {
	client, assets, err := waitsClient(ctx, e, phase+"-client")
	if err != nil {
		return nil, nil, nil, err
	}
	w, err := spawnWaitsWorker(ctx, e, cfg, phase+"-worker")
	if err != nil {
		return nil, nil, nil, err
	}
	return client, assets, w, nil
}

// close stops the worker process, setting *err when it fails and *err
// is nil, and keeps its log summary in *logs.
func (w *waitsWorker) close(err *error, logs *[]string) {
	if serr := w.stop(); serr != nil && *err == nil {
		*err = fmt.Errorf("stop worker process: %w", serr)
	}
	*logs = w.logs.summary()
}

func waitsClient(ctx context.Context, e *env, name string) (*jetflow.Client, *jetstream.Assets, error) {
	nc, err := e.conn(name)
	if err != nil {
		return nil, nil, err
	}
	assets, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return nil, nil, err
	}
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{Name: "bench", RequestTimeout: time.Minute})
	return c, assets, err
}

// timerMsgs is the number of messages in the timers stream.
func timerMsgs(ctx context.Context, assets *jetstream.Assets) (uint64, error) {
	info, err := assets.Timers.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// waitTimers waits until the timers stream holds want messages: every run
// has parked at its wait and stored its timer (a sleep's wake-up, an event
// wait's recheck).
func waitTimers(ctx context.Context, assets *jetstream.Assets, want uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := timerMsgs(ctx, assets)
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s: %d of %d timers stored", timeout, n, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// streamBytes is the bytes every stream (every KV bucket included) holds
// but the raw phases' BENCH_* streams.
func streamBytes(ctx context.Context, js natsjs.JetStream) (map[string]uint64, error) {
	out := map[string]uint64{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "BENCH_") {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		out[name] = info.State.Bytes
	}
	return out, names.Err()
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// windowStats measures the worker over window: its stats at the end (and
// its heap profile, written to profile unless that is ""), the CPU it
// spent in the window, and the CPU this process (the embedded server, the
// client idle) spent in it.
func windowStats(ctx context.Context, w *waitsWorker, window time.Duration, profile string) (procStats, time.Duration, time.Duration, error) {
	s0, err := w.stats(ctx, "")
	if err != nil {
		return s0, 0, 0, err
	}
	b0 := processCPU()
	if err := pause(ctx, window); err != nil {
		return s0, 0, 0, err
	}
	b1 := processCPU()
	s1, err := w.stats(ctx, profile)
	return s1, s1.CPU - s0.CPU, b1 - b0, err
}

// sleepFigures is one repetition of the sleepers phase.
type sleepFigures struct {
	n                 int
	toSleep           time.Duration // first start call -> every run's wake-up timer stored
	idle, sleeping    procStats     // the worker process at the end of each window
	idleCPU, sleepCPU time.Duration // CPU the worker spent in each window
	// CPU the bench process (the embedded server) spent in each window.
	brokerIdleCPU, brokerSleepCPU time.Duration
	window                        time.Duration
	added                         map[string]int64 // bytes each stream gained while the runs went to sleep
	raw                           rawSchedFigures
	logs                          []string
}

func (f sleepFigures) bytesPerRun() float64 {
	var sum int64
	for _, b := range f.added {
		sum += b
	}
	return float64(sum) / float64(f.n)
}

// goroutineSlack is how many more goroutines a worker may hold while n
// runs sleep than idle: less than one per run.
func goroutineSlack(n int) int { return 50 + n/100 }

var sleepResults []sleepFigures

// engineSleepers is one repetition of the sleepers phase.
func engineSleepers(ctx context.Context, e *env, cfg config, rep int) (f sleepFigures, err error) {
	n := cfg.sleepers
	f.n, f.window = n, cfg.waitWindow
	if f.raw, err = rawSchedules(ctx, e, cfg, n, time.Now().Add(cfg.sleep), false); err != nil {
		return f, fmt.Errorf("raw: %w", err)
	}
	client, assets, w, err := openWaitsPhase(ctx, e, cfg, "sleep")
	if err != nil {
		return f, err
	}
	defer w.close(&err, &f.logs)
	// Idle: the worker has started; one window to settle, one measured.
	if err := pause(ctx, f.window); err != nil {
		return f, err
	}
	if f.idle, f.idleCPU, f.brokerIdleCPU, err = windowStats(ctx, w, f.window, ""); err != nil {
		return f, err
	}
	before, err := streamBytes(ctx, assets.JS)
	if err != nil {
		return f, err
	}
	base, err := timerMsgs(ctx, assets)
	if err != nil {
		return f, err
	}
	seconds := int(cfg.sleep / time.Second)
	prefix := "sleep" + strconv.Itoa(rep) + "-"
	t0 := time.Now()
	if _, err := parallel(ctx, n, cfg.starters, func(ctx context.Context, i int) error {
		_, err := jetflow.Start(ctx, client, sleepWorkflow, seconds, jetflow.WithRunID(prefix+strconv.Itoa(i)))
		return err
	}); err != nil {
		return f, err
	}
	if err := waitTimers(ctx, assets, base+uint64(n), cfg.timeout); err != nil {
		return f, err
	}
	f.toSleep = time.Since(t0)
	after, err := streamBytes(ctx, assets.JS)
	if err != nil {
		return f, err
	}
	f.added = map[string]int64{}
	for name, b := range after {
		if d := int64(b) - int64(before[name]); d != 0 {
			f.added[name] = d
		}
	}
	// Sleeping: one window to settle after the burst, one measured.
	if err := pause(ctx, f.window); err != nil {
		return f, err
	}
	profile := ""
	if cfg.workerHeapProfile != "" {
		if profile, err = filepath.Abs(cfg.workerHeapProfile); err != nil {
			return f, err
		}
	}
	if f.sleeping, f.sleepCPU, f.brokerSleepCPU, err = windowStats(ctx, w, f.window, profile); err != nil {
		return f, err
	}
	if grown := f.sleeping.Goroutines - f.idle.Goroutines; grown > goroutineSlack(n) {
		return f, fmt.Errorf("the worker holds %d goroutines while %d runs sleep, %d idle: a sleeping run must hold none",
			f.sleeping.Goroutines, n, f.idle.Goroutines)
	}
	return f, nil
}

// wakeStats is when n due messages (or runs) were seen done, relative to
// their due time.
type wakeStats struct {
	n             int
	last          time.Duration // due -> the last one done
	p50, p99, max time.Duration // lateness
	early         int           // done before the due time
}

func (w wakeStats) rate() float64 {
	if w.last <= 0 {
		return 0
	}
	return float64(w.n) / w.last.Seconds()
}

// lateness summarises done times (Unix ns) against due.
func lateness(done []int64, due time.Time) wakeStats {
	ws := wakeStats{n: len(done)}
	lat := make([]time.Duration, 0, len(done))
	for _, d := range done {
		l := time.Duration(d - due.UnixNano())
		if l < 0 {
			ws.early++
		}
		lat = append(lat, l)
	}
	if len(lat) == 0 {
		return ws
	}
	slices.Sort(lat)
	ws.p50, ws.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	ws.max, ws.last = lat[len(lat)-1], lat[len(lat)-1]
	return ws
}

// rawSchedFigures is the raw reference of scheduled messages.
type rawSchedFigures struct {
	publishRate float64 // async publishes of scheduled messages, msgs/s
	bytesPerMsg float64 // stream bytes per stored schedule
	wake        wakeStats
}

// roundUpSecond is t rounded up to a whole second: schedules fire on whole
// seconds.
func roundUpSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}

// rawSchedules publishes n scheduled messages due at due to a stream of
// its own (as the engine's timers stream: work queue, schedules on
// bench.timer.<i> published to bench.due.<i>), measures the publish rate
// and the bytes stored; with consume, it consumes the due messages with a
// plain pull consumer and measures when each arrives.
func rawSchedules(ctx context.Context, e *env, cfg config, n int, due time.Time, consume bool) (f rawSchedFigures, err error) {
	nc, err := e.conn("raw-schedules")
	if err != nil {
		return f, err
	}
	var asyncErrs atomic.Int64
	var lastErr atomic.Value
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncErrHandler(func(_ natsjs.JetStream, _ *nats.Msg, err error) {
		asyncErrs.Add(1)
		lastErr.Store(err.Error())
	}))
	if err != nil {
		return f, err
	}
	const name = "BENCH_TIMERS"
	stream, err := js.CreateStream(ctx, natsjs.StreamConfig{
		Name: name, Subjects: []string{"bench.timer.>", "bench.due.>"}, Retention: natsjs.WorkQueuePolicy,
		Storage: natsjs.FileStorage, Duplicates: 2 * time.Minute, AllowMsgSchedules: true,
	})
	if err != nil {
		return f, fmt.Errorf("create stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }()
	due = roundUpSecond(due)
	t0 := time.Now()
	for i := range n {
		id := strconv.Itoa(i)
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "bench.timer." + id, Data: rawPayload}, natsjs.WithMsgID("t-"+id),
			natsjs.WithScheduleAt(due.UTC()), natsjs.WithScheduleTarget("bench.due."+id), natsjs.WithStallWait(cfg.timeout)); err != nil {
			return f, fmt.Errorf("publish %d: %w", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return f, ctx.Err()
	case <-time.After(cfg.timeout):
		return f, fmt.Errorf("acks still pending after %s: %d", cfg.timeout, js.PublishAsyncPending())
	}
	f.publishRate = float64(n) / time.Since(t0).Seconds()
	if k := asyncErrs.Load(); k > 0 {
		return f, fmt.Errorf("%d async publishes failed, last: %v", k, lastErr.Load())
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return f, err
	}
	if info.State.Msgs != uint64(n) {
		return f, fmt.Errorf("stream holds %d messages, published %d", info.State.Msgs, n)
	}
	f.bytesPerMsg = float64(info.State.Bytes) / float64(n)
	if !consume {
		return f, nil
	}
	if time.Now().After(due) {
		return f, fmt.Errorf("publishing took past the due time %s", due.Format(time.RFC3339))
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, natsjs.ConsumerConfig{
		Durable: "bench_due", FilterSubject: "bench.due.>", AckPolicy: natsjs.AckExplicitPolicy,
		MaxAckPending: 64 * cfg.concurrency, AckWait: 30 * time.Second,
	})
	if err != nil {
		return f, fmt.Errorf("create consumer: %w", err)
	}
	done := make([]atomic.Int64, n)
	var got atomic.Int64
	all := make(chan struct{})
	cc, err := cons.Consume(func(m natsjs.Msg) {
		now := time.Now().UnixNano()
		i, err := strconv.Atoi(strings.TrimPrefix(m.Subject(), "bench.due."))
		_ = m.Ack()
		if err == nil && i >= 0 && i < n && done[i].CompareAndSwap(0, now) && got.Add(1) == int64(n) {
			close(all)
		}
	}, natsjs.PullMaxMessages(cfg.concurrency))
	if err != nil {
		return f, fmt.Errorf("consume: %w", err)
	}
	defer cc.Stop()
	select {
	case <-all:
	case <-ctx.Done():
		return f, ctx.Err()
	case <-time.After(time.Until(due) + cfg.timeout):
		return f, fmt.Errorf("%d of %d scheduled messages consumed %s after their due time", got.Load(), n, cfg.timeout)
	}
	times := make([]int64, n)
	for i := range done {
		times[i] = done[i].Load()
	}
	f.wake = lateness(times, due)
	return f, nil
}

// wakeFigures is one repetition of the wakeups phase.
type wakeFigures struct {
	n       int
	lead    time.Duration // start of the first run -> due time
	toSleep time.Duration // first start call -> every timer stored
	engine  wakeStats
	raw     rawSchedFigures
	logs    []string
}

var wakeResults []wakeFigures

// wakeLead is how long before the common due time the wakeups phase starts
// its runs: --wake-lead, or 5s plus 2ms a run.
func wakeLead(cfg config, n int) time.Duration {
	if cfg.wakeLead > 0 {
		return cfg.wakeLead
	}
	return 5*time.Second + time.Duration(n)*2*time.Millisecond
}

// engineWakeups is one repetition of the wakeups phase.
func engineWakeups(ctx context.Context, e *env, cfg config, rep int) (f wakeFigures, err error) {
	n := cfg.wakeups
	f.n = n
	if f.raw, err = rawSchedules(ctx, e, cfg, n, time.Now().Add(2*time.Second+time.Duration(n)*50*time.Microsecond), true); err != nil {
		return f, fmt.Errorf("raw: %w", err)
	}
	client, assets, w, err := openWaitsPhase(ctx, e, cfg, "wake")
	if err != nil {
		return f, err
	}
	defer w.close(&err, &f.logs)
	prefix := "wake" + strconv.Itoa(rep) + "-"
	ids := make([]string, n)
	index := make(map[string]int, n)
	for i := range ids {
		ids[i] = prefix + strconv.Itoa(i)
		index[ids[i]] = i
	}
	t := newTracker(n)
	stopWatch, err := watchCompletions(ctx, assets, index, t, func(r state.Run) bool { return r.Status == state.StatusCompleted })
	if err != nil {
		return f, err
	}
	defer stopWatch()
	base, err := timerMsgs(ctx, assets)
	if err != nil {
		return f, err
	}
	t0 := time.Now()
	due := roundUpSecond(t0.Add(wakeLead(cfg, n)))
	f.lead = due.Sub(t0)
	if _, err := parallel(ctx, n, cfg.starters, func(ctx context.Context, i int) error {
		_, err := jetflow.Start(ctx, client, wakeWorkflow, due.UnixMilli(), jetflow.WithRunID(ids[i]))
		return err
	}); err != nil {
		return f, err
	}
	if err := waitTimers(ctx, assets, base+uint64(n), time.Until(due)); err != nil {
		return f, fmt.Errorf("not every run was asleep by the due time (raise --wake-lead, now %s): %w", f.lead, err)
	}
	f.toSleep = time.Since(t0)
	if err := t.wait(ctx, time.Until(due)+cfg.timeout); err != nil {
		return f, err
	}
	if k := t.failed.Load(); k > 0 {
		return f, fmt.Errorf("%d runs failed", k)
	}
	times := make([]int64, n)
	for i := range t.done {
		times[i] = t.done[i].Load()
	}
	f.engine = lateness(times, due)
	if f.engine.early > 0 {
		return f, fmt.Errorf("%d runs completed before their due time", f.engine.early)
	}
	return f, verifyRuns(ctx, assets, ids, "1")
}

// eventFigures is one repetition of the events phase.
type eventFigures struct {
	runs, sends, dups    int
	delivered, duplicate int64
	sendRate             float64 // SendEvent calls/s, duplicates included
	resumed              *e2eStats
	rawRate              float64 // raw request-reply + KV create calls/s, same plan
	logs                 []string
}

var eventResults []eventFigures

// engineEvents is one repetition of the events phase.
func engineEvents(ctx context.Context, e *env, cfg config, rep int) (f eventFigures, err error) {
	n := cfg.events
	prefix := "ev" + strconv.Itoa(rep)
	plan := newWorkload(prefix, n, cfg.dupFrac, cfg.starters)
	f.runs, f.sends, f.dups = n, len(plan.jobs), plan.dups
	if f.rawRate, err = rawEvents(ctx, e, cfg, plan); err != nil {
		return f, fmt.Errorf("raw: %w", err)
	}
	client, assets, w, err := openWaitsPhase(ctx, e, cfg, "event")
	if err != nil {
		return f, err
	}
	defer w.close(&err, &f.logs)
	t := newTracker(n)
	stopWatch, err := watchEventSteps(ctx, assets, plan.index, t)
	if err != nil {
		return f, err
	}
	defer stopWatch()
	base, err := timerMsgs(ctx, assets)
	if err != nil {
		return f, err
	}
	hold := int(cfg.sleep / time.Second)
	if _, err := parallel(ctx, n, cfg.starters, func(ctx context.Context, i int) error {
		_, err := jetflow.Start(ctx, client, eventWorkflow, hold, jetflow.WithRunID(plan.ids[i]))
		return err
	}); err != nil {
		return f, err
	}
	// Every run waits: each holds its wait's recheck timer.
	if err := waitTimers(ctx, assets, base+uint64(n), cfg.timeout); err != nil {
		return f, err
	}
	var delivered, duplicate atomic.Int64
	t0 := time.Now()
	err = runStarters(ctx, plan, t, cfg.starters, 0, func(ctx context.Context, run int) error {
		id := plan.ids[run]
		res, err := client.SendEvent(ctx, id, eventName, "e-"+id, json.RawMessage(eventPayload))
		switch {
		case err != nil:
			return err
		case res.Outcome == jetflow.EventDelivered:
			delivered.Add(1)
		case res.Outcome == jetflow.EventDuplicate:
			duplicate.Add(1)
		default:
			return fmt.Errorf("outcome %q", res.Outcome)
		}
		return nil
	})
	if err != nil {
		return f, err
	}
	f.sendRate = float64(f.sends) / time.Since(t0).Seconds()
	f.delivered, f.duplicate = delivered.Load(), duplicate.Load()
	if f.delivered != int64(n) || f.duplicate != int64(plan.dups) {
		return f, fmt.Errorf("outcomes: %d delivered, %d duplicate; the plan: %d delivered, %d duplicate", f.delivered, f.duplicate, n, plan.dups)
	}
	if err := t.wait(ctx, cfg.timeout); err != nil {
		return f, err
	}
	f.resumed = t.summarize(1)
	if f.resumed.failed > 0 {
		return f, fmt.Errorf("%d runs' step %q did not return the event's payload %s", f.resumed.failed, eventStep, eventPayload)
	}
	return f, nil
}

// watchEventSteps marks run index[run] finished in t when the step
// eventStep of the run is committed: the run resumed after its event. It
// is a success when the step's output is the event's payload.
func watchEventSteps(ctx context.Context, assets *jetstream.Assets, index map[string]int, t *tracker) (func(), error) {
	wctx, cancel := context.WithCancel(ctx)
	watcher, err := assets.Steps.Raw().WatchAll(wctx, natsjs.UpdatesOnly())
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch steps: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ent := range watcher.Updates() {
			if ent == nil {
				continue
			}
			run, ok := strings.CutSuffix(ent.Key(), "."+eventStep+".0")
			i, known := index[run]
			if !ok || !known {
				continue
			}
			st, err := state.DecodeStep(ent.Value())
			t.finished(i, err == nil && string(st.Output) == eventPayload)
		}
	})
	return func() { cancel(); _ = watcher.Stop(); wg.Wait() }, nil
}

// rawEvents is the raw reference of the events phase: the same plan of
// calls, each a request to a plain responder (cfg.concurrency goroutines
// behind one queue subscription) that KV-creates the event ID: a created
// key is "delivered", an existing one "duplicate". The counts must match
// the plan as the engine's must.
func rawEvents(ctx context.Context, e *env, cfg config, plan *workload) (rate float64, err error) {
	snc, err := e.conn("raw-events-server")
	if err != nil {
		return 0, err
	}
	cnc, err := e.conn("raw-events-client")
	if err != nil {
		return 0, err
	}
	js, err := natsjs.New(snc)
	if err != nil {
		return 0, err
	}
	const bucket = "bench_events"
	kv, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: bucket, History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return 0, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), bucket) }()
	work := make(chan *nats.Msg, cfg.concurrency)
	var wg sync.WaitGroup
	for range cfg.concurrency {
		wg.Go(func() {
			for m := range work {
				outcome := "delivered"
				if _, err := kv.Create(ctx, string(m.Data), []byte(eventPayload)); errors.Is(err, natsjs.ErrKeyExists) {
					outcome = "duplicate"
				} else if err != nil {
					outcome = "error: " + err.Error()
				}
				_ = m.Respond([]byte(outcome))
			}
		})
	}
	defer wg.Wait()
	defer close(work)
	sub, err := snc.QueueSubscribe("bench.events", "bench_events", func(m *nats.Msg) { work <- m })
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := snc.Flush(); err != nil {
		return 0, err
	}
	var delivered, duplicate atomic.Int64
	t := newTracker(len(plan.ids))
	t0 := time.Now()
	err = runStarters(ctx, plan, t, cfg.starters, 0, func(ctx context.Context, run int) error {
		m, err := cnc.RequestWithContext(ctx, "bench.events", []byte("e-"+plan.ids[run]))
		if err != nil {
			return err
		}
		switch string(m.Data) {
		case "delivered":
			delivered.Add(1)
		case "duplicate":
			duplicate.Add(1)
		default:
			return errors.New(string(m.Data))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	rate = float64(len(plan.jobs)) / time.Since(t0).Seconds()
	if delivered.Load() != int64(len(plan.ids)) || duplicate.Load() != int64(plan.dups) {
		return rate, fmt.Errorf("outcomes: %d delivered, %d duplicate; the plan: %d, %d", delivered.Load(), duplicate.Load(), len(plan.ids), plan.dups)
	}
	return rate, nil
}

// medianWaits is the median over the repetitions of f.
func medianWaits[T any](list []T, f func(T) float64) float64 {
	xs := make([]float64, len(list))
	for i, x := range list {
		xs[i] = f(x)
	}
	return median(xs)
}

func mib(b float64) string { return strconv.FormatFloat(b/(1<<20), 'f', 1, 64) + " MiB" }

func cpuShare(cpu, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(cpu) / float64(window)
}

func percent(v float64) string { return strconv.FormatFloat(100*v, 'f', 2, 64) + "%" }

// printWaitsReport prints the sleepers, wakeups and events phases' figures.
func printWaitsReport(out io.Writer, r *results) {
	c := r.cfg
	header := [4]string{"metric", "jetflow", "raw reference", "ratio"}
	if l := sleepResults; len(l) > 0 {
		m := func(f func(sleepFigures) float64) float64 { return medianWaits(l, f) }
		stuck := "default StuckAfter"
		if c.workerStuckAfter > 0 {
			stuck = "StuckAfter " + c.workerStuckAfter.String()
		}
		fmt.Fprintf(out, "sleepers: %s runs of 1 step + Sleep(%s), %d starters, 1 worker process of concurrency %d (%s); worker measured over %s idle (before any run) and %s while every run sleeps (after a %s settle)\n",
			num(float64(c.sleepers)), c.sleep, c.starters, c.concurrency, stuck, c.waitWindow, c.waitWindow, c.waitWindow)
		rate := m(func(f sleepFigures) float64 { return float64(f.n) / f.toSleep.Seconds() })
		raw := m(func(f sleepFigures) float64 { return f.raw.publishRate })
		bpr := m(sleepFigures.bytesPerRun)
		rawB := m(func(f sleepFigures) float64 { return f.raw.bytesPerMsg })
		rss, rssIdle := m(func(f sleepFigures) float64 { return float64(f.sleeping.RSS) }), m(func(f sleepFigures) float64 { return float64(f.idle.RSS) })
		heap, heapIdle := m(func(f sleepFigures) float64 { return float64(f.sleeping.HeapAlloc) }), m(func(f sleepFigures) float64 { return float64(f.idle.HeapAlloc) })
		gr, grIdle := m(func(f sleepFigures) float64 { return float64(f.sleeping.Goroutines) }), m(func(f sleepFigures) float64 { return float64(f.idle.Goroutines) })
		cpu := m(func(f sleepFigures) float64 { return cpuShare(f.sleepCPU, f.window) })
		cpuIdle := m(func(f sleepFigures) float64 { return cpuShare(f.idleCPU, f.window) })
		bcpu := m(func(f sleepFigures) float64 { return cpuShare(f.brokerSleepCPU, f.window) })
		bcpuIdle := m(func(f sleepFigures) float64 { return cpuShare(f.brokerIdleCPU, f.window) })
		rows := [][4]string{
			{"runs reaching their sleep /s (start -> timer stored)", num(rate), "scheduled msgs published/s " + num(raw), ratio(rate, raw)},
			{"broker bytes per sleeping run (all streams)", num(bpr), "bytes per scheduled msg " + num(rawB), ratio(bpr, rawB)},
		}
		var names []string
		for name := range l[len(l)-1].added {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			v := m(func(f sleepFigures) float64 { return float64(f.added[name]) / float64(f.n) })
			rows = append(rows, [4]string{"  of which " + name, num(v), "", ""})
		}
		rows = append(rows,
			[4]string{"worker RSS while sleeping (after GC)", mib(rss), "idle " + mib(rssIdle), ratio(rss, rssIdle)},
			[4]string{"worker Go heap while sleeping (after GC)", mib(heap), "idle " + mib(heapIdle), ratio(heap, heapIdle)},
			[4]string{"worker heap bytes per sleeping run", dec2((heap - heapIdle) / float64(c.sleepers)), "", ""},
			[4]string{"worker goroutines while sleeping", num(gr), "idle " + num(grIdle), ratio(gr, grIdle)},
			[4]string{"worker CPU while sleeping (share of a core)", percent(cpu), "idle " + percent(cpuIdle), ratio(cpu, cpuIdle)},
			[4]string{"server CPU while sleeping (bench process)", percent(bcpu), "idle " + percent(bcpuIdle), ratio(bcpu, bcpuIdle)},
			[4]string{"worker peak RSS (the start burst)", mib(m(func(f sleepFigures) float64 { return float64(f.sleeping.PeakRSS) })), "", ""},
		)
		printTable(out, header, rows)
		printWaitLogs(out, "sleepers", allLogs(l, func(f sleepFigures) []string { return f.logs }))
		fmt.Fprintln(out)
	}
	if l := wakeResults; len(l) > 0 {
		m := func(f func(wakeFigures) float64) float64 { return medianWaits(l, f) }
		fmt.Fprintf(out, "wakeups: %s runs of 1 step + SleepUntil(one due time, %s after the first start), 1 worker process of concurrency %d; raw: as many scheduled msgs due at once, one pull consumer\n",
			num(float64(c.wakeups)), dur(time.Duration(m(func(f wakeFigures) float64 { return float64(f.lead) }))), c.concurrency)
		rate, raw := m(func(f wakeFigures) float64 { return f.engine.rate() }), m(func(f wakeFigures) float64 { return f.raw.wake.rate() })
		d := func(f func(wakeStats) time.Duration) (float64, float64) {
			return m(func(x wakeFigures) float64 { return float64(f(x.engine)) }), m(func(x wakeFigures) float64 { return float64(f(x.raw.wake)) })
		}
		p50, r50 := d(func(w wakeStats) time.Duration { return w.p50 })
		p99, r99 := d(func(w wakeStats) time.Duration { return w.p99 })
		mx, rmx := d(func(w wakeStats) time.Duration { return w.max })
		toSleep := m(func(f wakeFigures) float64 { return float64(f.n) / f.toSleep.Seconds() })
		rows := [][4]string{
			{"wake-ups/s (due -> last run completed)", num(rate), "due msgs consumed/s " + num(raw), ratio(rate, raw)},
			{"lateness p50 (due -> run completed)", dur(time.Duration(p50)), "due -> consumed " + dur(time.Duration(r50)), ratio(p50, r50)},
			{"lateness p99", dur(time.Duration(p99)), dur(time.Duration(r99)), ratio(p99, r99)},
			{"lateness max", dur(time.Duration(mx)), dur(time.Duration(rmx)), ratio(mx, rmx)},
			{"runs reaching their sleep /s", num(toSleep), "", ""},
		}
		printTable(out, header, rows)
		printWaitLogs(out, "wakeups", allLogs(l, func(f wakeFigures) []string { return f.logs }))
		fmt.Fprintln(out)
	}
	if l := eventResults; len(l) > 0 {
		m := func(f func(eventFigures) float64) float64 { return medianWaits(l, f) }
		x := l[len(l)-1]
		fmt.Fprintf(out, "events: %s runs waiting on WaitEvent, %s SendEvent calls (%s repeat an event ID) from %d goroutines, 1 worker process of concurrency %d; raw: the same calls as requests to a responder that KV-creates the event ID\n",
			num(float64(x.runs)), num(float64(x.sends)), num(float64(x.dups)), c.starters, c.concurrency)
		rate, raw := m(func(f eventFigures) float64 { return f.sendRate }), m(func(f eventFigures) float64 { return f.rawRate })
		res := m(func(f eventFigures) float64 { return f.resumed.runsPerSec() })
		p50 := m(func(f eventFigures) float64 { return float64(f.resumed.p50) })
		p99 := m(func(f eventFigures) float64 { return float64(f.resumed.p99) })
		rows := [][4]string{
			{"event sends/s (duplicates included)", num(rate), "request-reply + KV create/s " + num(raw), ratio(rate, raw)},
			{"runs resumed /s (first send -> last next step done)", num(res), "", ""},
			{"first send -> run's next step done p50", dur(time.Duration(p50)), "", ""},
			{"first send -> run's next step done p99", dur(time.Duration(p99)), "", ""},
			{"outcomes delivered / duplicate", num(float64(x.delivered)) + " / " + num(float64(x.duplicate)), "plan " + num(float64(x.runs)) + " / " + num(float64(x.dups)), "exact"},
		}
		printTable(out, header, rows)
		printWaitLogs(out, "events", allLogs(l, func(f eventFigures) []string { return f.logs }))
		fmt.Fprintln(out)
	}
}

// allLogs gathers the worker log summaries of every repetition.
func allLogs[T any](list []T, f func(T) []string) []string {
	var out []string
	for _, x := range list {
		out = append(out, f(x)...)
	}
	return out
}

func printWaitLogs(out io.Writer, name string, logs []string) {
	for _, l := range logs {
		if !strings.Contains(l, "no retries") {
			fmt.Fprintf(out, "%s: %s\n", name, l)
		}
	}
}
