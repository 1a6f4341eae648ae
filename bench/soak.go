package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// The soak mode pushes a large number of starts (30% duplicates by default)
// through worker processes that it SIGKILLs every few seconds, then reads
// everything back with faultcheck and prints the verdict with throughput.
//
//	go run ./bench soak [--starts 1000000] [--kill-every 10s] [--workers 2] [--nats-url URL --replicas 3]
//
// Worker processes are this binary re-executed as `bench soak-worker`.

const effectSubject = "jetflow.bench.effect"

type soakConfig struct {
	starts      int
	dupFrac     float64
	workers     int
	killEvery   time.Duration
	concurrency int
	starters    int
	natsURL     string
	replicas    int
	timeout     time.Duration
	syncAlways  bool
}

func parseSoak(args []string) (soakConfig, error) {
	var c soakConfig
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.IntVar(&c.starts, "starts", 1_000_000, "start calls in all, duplicates included")
	fs.Float64Var(&c.dupFrac, "dup-frac", 0.3, "fraction of the start calls that repeat an earlier run ID")
	fs.IntVar(&c.workers, "workers", 2, "worker processes")
	fs.DurationVar(&c.killEvery, "kill-every", 10*time.Second, "SIGKILL a random worker process this often (0: never)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "worker concurrency")
	fs.IntVar(&c.starters, "starters", 16, "concurrent starters")
	fs.StringVar(&c.natsURL, "nats-url", "", "NATS to use (default: an embedded server in a temporary directory)")
	fs.IntVar(&c.replicas, "replicas", 1, "stream and bucket replicas (3 on a three-node cluster)")
	fs.DurationVar(&c.timeout, "timeout", time.Hour, "give up after this long")
	fs.BoolVar(&c.syncAlways, "sync-always", false, "embedded server fsyncs every write")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.starts < 1 || c.workers < 1 || c.concurrency < 1 || c.starters < 1 || c.dupFrac < 0 || c.dupFrac >= 1 {
		return c, errors.New("soak: --starts, --workers, --concurrency, --starters must be at least 1 and --dup-frac within [0, 1)")
	}
	return c, nil
}

func runSoak(ctx context.Context, args []string) error {
	cfg, err := parseSoak(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	url := cfg.natsURL
	if url == "" {
		dir, err := os.MkdirTemp("", "jetflow-soak-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := natsserver.Start(natsserver.Config{DataDir: dir, Port: -1, SyncAlways: cfg.syncAlways})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
	}
	nc, err := jetstream.Connect(url, "bench-soak")
	if err != nil {
		return err
	}
	defer nc.Close()
	topo := jetstream.Topology{Replicas: cfg.replicas}
	assets, err := jetstream.Provision(ctx, nc, topo, jetstream.CreateOrUpdate)
	if err != nil {
		return err
	}
	client, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{Name: "soak", Topology: jetflow.Topology{Replicas: cfg.replicas}})
	if err != nil {
		return err
	}

	effects := faultcheck.NewEffects()
	sub, err := nc.QueueSubscribe(effectSubject, "soak", func(m *nats.Msg) {
		step, attempt, ok := strings.Cut(string(m.Data), " ")
		n, err := strconv.Atoi(attempt)
		if !ok || err != nil {
			_ = m.Respond([]byte("bad effect"))
			return
		}
		effects.Record(step, n)
		_ = m.Respond(nil)
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return err
	}

	fleet := &workerFleet{url: url, cfg: cfg}
	for range cfg.workers {
		if err := fleet.spawn(); err != nil {
			return err
		}
	}
	defer fleet.stopAll()
	stopKiller := fleet.killEvery(cfg.killEvery)

	fmt.Printf("soak: %s starts (%.0f%% duplicates) by %d starters, %d worker processes (concurrency %d), a SIGKILL every %s, NATS %s, replicas %d\n",
		num(float64(cfg.starts)), cfg.dupFrac*100, cfg.starters, cfg.workers, cfg.concurrency, cfg.killEvery, url, cfg.replicas)
	ledger := faultcheck.NewLedger()
	t0 := time.Now()
	if err := soakStarts(ctx, client, cfg, ledger); err != nil {
		stopKiller()
		return err
	}
	startDur := time.Since(t0)
	stopKiller()
	fmt.Printf("soak: starts done in %s (%s starts/s); waiting for every run to finish\n",
		startDur.Round(time.Millisecond), num(float64(cfg.starts)/startDur.Seconds()))
	v := faultcheck.Check(ctx, assets, ledger, effects, nil, 3, soakAckWait)
	total := time.Since(t0)
	fmt.Printf("soak: all final after %s: %s runs/s, %s steps/s end to end; %d worker processes killed\n",
		total.Round(time.Millisecond), num(float64(v.Completed)/total.Seconds()),
		num(float64(v.CommittedSteps)/total.Seconds()), fleet.kills.Load())
	fmt.Printf("soak verdict: %s\n", v)
	if !v.OK() {
		return errors.New("soak: lost or doubled work")
	}
	fmt.Println("soak verdict: OK (nothing lost, nothing done twice)")
	return nil
}

// soakStarts makes cfg.starts start calls; a failed call is retried with
// the same run ID.
func soakStarts(ctx context.Context, c *jetflow.Client, cfg soakConfig, l *faultcheck.Ledger) error {
	wf := soakWorkflow(nil)
	ids := make(chan string, 1024)
	go func() {
		defer close(ids)
		next := 0 // run IDs soak-0 .. soak-(next-1) have been started
		for range cfg.starts {
			id := next
			if next > 0 && rand.Float64() < cfg.dupFrac {
				id = next - 1 - rand.IntN(min(next, 1000)) // a recent run again
			} else {
				next++
			}
			select {
			case ids <- "soak-" + strconv.Itoa(id):
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		firstErr atomic.Value
		done     atomic.Int64
	)
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	go func() {
		for range progress.C {
			fmt.Printf("soak: %s starts accepted\n", num(float64(done.Load())))
		}
	}()
	for range cfg.starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				for {
					sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					h, err := jetflow.Start(sctx, c, wf, 0, jetflow.WithRunID(id))
					cancel()
					if err == nil {
						l.Accepted(id, h.Outcome == jetflow.OutcomeCreated)
						done.Add(1)
						break
					}
					l.Failed()
					if ctx.Err() != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return err
	}
	return ctx.Err()
}

// soakWorkflow has three steps; each reports its side effect (step ID and
// attempt) to the soak process before returning. nc is nil on the
// starting side, which never runs steps.
func soakWorkflow(nc *nats.Conn) *jetflow.Workflow[int, int] {
	return jetflow.NewWorkflow("soak", func(ctx *jetflow.Context, in int) (int, error) {
		sum := in
		for _, name := range []string{"a", "b", "c"} {
			v, err := jetflow.Step(ctx, name, func(sctx context.Context) (int, error) {
				info, _ := jetflow.StepDetailsFrom(sctx)
				if _, err := nc.RequestWithContext(sctx, effectSubject, []byte(info.StepID+" "+strconv.Itoa(info.Attempt))); err != nil {
					return 0, err
				}
				return sum + 1, nil
			}, jetflow.WithBackoff(100*time.Millisecond, time.Second), jetflow.WithMaxAttempts(20))
			if err != nil {
				return 0, err
			}
			sum = v
		}
		return sum, nil
	})
}

// runSoakWorker is a worker process of the soak.
func runSoakWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("soak-worker", flag.ContinueOnError)
	url := fs.String("nats-url", "", "NATS URL")
	concurrency := fs.Int("concurrency", 64, "worker concurrency")
	replicas := fs.Int("replicas", 1, "replicas")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nc, err := jetstream.Connect(*url, "bench-soak-worker")
	if err != nil {
		return err
	}
	defer nc.Close()
	ws := jetflow.NewRegistry()
	if err := ws.Register(soakWorkflow(nc)); err != nil {
		return err
	}
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Concurrency: *concurrency, AckWait: soakAckWait,
		Topology: jetflow.Topology{Replicas: *replicas},
	})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.Stop(stopCtx)
}

// workerFleet runs the soak's worker processes.
type workerFleet struct {
	url   string
	cfg   soakConfig
	mu    sync.Mutex
	procs []*exec.Cmd
	kills atomic.Int64
}

func (f *workerFleet) spawn() error {
	cmd := exec.Command(os.Args[0], "soak-worker", "--nats-url", f.url,
		"--concurrency", strconv.Itoa(f.cfg.concurrency), "--replicas", strconv.Itoa(f.cfg.replicas))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("soak: start worker process: %w", err)
	}
	f.mu.Lock()
	f.procs = append(f.procs, cmd)
	f.mu.Unlock()
	return nil
}

// killEvery SIGKILLs a random worker process every d and starts a new one,
// until the returned stop is called.
func (f *workerFleet) killEvery(d time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			f.mu.Lock()
			i := rand.IntN(len(f.procs))
			victim := f.procs[i]
			f.procs = append(f.procs[:i], f.procs[i+1:]...)
			f.mu.Unlock()
			_ = victim.Process.Signal(syscall.SIGKILL)
			_ = victim.Wait()
			f.kills.Add(1)
			if err := f.spawn(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (f *workerFleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range f.procs {
		_ = p.Wait()
	}
}

// soakAckWait is the soak workers' AckWait, and the checker's allowance
// between a commit and a later attempt's effect.
const soakAckWait = 2 * time.Second
