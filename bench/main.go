// Command bench measures jetflow against the raw JetStream limits of the
// same embedded nats-server, in one process run on one machine, and prints
// the ratios. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
)

type config struct {
	runs         int
	dupFrac      float64
	starters     int
	startRate    float64
	timeline     bool
	repeat       int
	concurrency  int
	pubN         int
	kvN          int
	kvG          int
	admitN       int
	admitG       int
	syncAlways   bool
	quick        bool
	timeout      time.Duration
	cpuProfile   string
	profilePhase string
	keepData     bool
	phases       map[string]bool
	fanoutRuns   int
	fanoutWidth  int
	deepRuns     int
	deepSteps    int
	shapeWorkers int
	sleepers     int
	sleep        time.Duration
	wakeups      int
	wakeLead     time.Duration
	events       int
	waitWindow   time.Duration
	// workerHeapProfile: where the sleepers phase's worker process
	// writes its heap profile while every run sleeps.
	workerHeapProfile string
	// workerStuckAfter: the waits phases' worker's StuckAfter (0: the
	// default), to see the sweeper's checks of long-waiting runs.
	workerStuckAfter time.Duration
	// indexRuns, indexGoroutines, indexSamples: the index phase's kept
	// runs, the goroutines that write them, and how often each page is
	// measured.
	indexRuns       int
	indexGoroutines int
	indexSamples    int
	// waiters: the waiters phase's runs, each waited for at once with
	// Client.WaitRun; backlog: the runs the backlog phase starts before
	// its worker process drains them.
	waiters int
	backlog int
}

// defaultPhases run unless --phases names others; allPhases adds the run
// shapes, which take longer and are asked for by name.
var (
	defaultPhases = []string{"publish", "kv", "mini", "e2e", "gated", "api", "admit", "taskkey", "http"}
	allPhases     = append(slices.Clone(defaultPhases), "latency", "waiters", "backlog", "fanout", "deep", "sleepers", "wakeups", "events", "index", "attrs")
)

// parseFlags parses the command line's arguments (without the program
// name) into a config, or fails on an unknown flag, a stray argument or a
// value out of range.
func parseFlags(args []string) (config, error) {
	var c config
	var phases string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&c.runs, "runs", 20000, "end-to-end workload: distinct run IDs (minimal program and jetflow)")
	fs.Float64Var(&c.dupFrac, "dup-frac", 0.25, "end-to-end workload: fraction of runs started twice")
	fs.IntVar(&c.starters, "starters", 16, "end-to-end workload: concurrent starters")
	fs.Float64Var(&c.startRate, "start-rate", 0, "end-to-end workload: pace start calls to this many per second in total (0 = as fast as the starters go)")
	fs.BoolVar(&c.timeline, "timeline", false, "print starts and completions per 250ms for the end-to-end phases")
	fs.IntVar(&c.concurrency, "concurrency", 64, "jetflow worker concurrency, and the minimal program's consumer pool size")
	fs.IntVar(&c.pubN, "publish-n", 100000, "raw async publish: messages")
	fs.IntVar(&c.kvN, "kv-n", 50000, "raw KV create: keys")
	fs.IntVar(&c.kvG, "kv-goroutines", 64, "raw KV create: goroutines")
	fs.IntVar(&c.admitN, "admit-n", 20000, "jetflow admission: distinct run IDs (each then started again as a duplicate)")
	fs.IntVar(&c.admitG, "admit-goroutines", 64, "jetflow admission: goroutines")
	fs.BoolVar(&c.syncAlways, "sync-always", false, "embedded server fsyncs every write (EmbeddedConfig.SyncAlways)")
	fs.IntVar(&c.repeat, "repeat", 1, "repeat every phase this many times (interleaved) and report medians")
	fs.BoolVar(&c.quick, "quick", false, "smoke run: every N divided by 10")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "end-to-end phases: give up waiting for completions after this long")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the first repetition of the --profile-phase phase to this file (server included: it is in-process)")
	fs.StringVar(&c.profilePhase, "profile-phase", "e2e", "the phase --cpuprofile profiles (index-pages: the index phase's page measurements, without its populate)")
	fs.BoolVar(&c.keepData, "keep-data", false, "keep the server's temporary data directory")
	fs.IntVar(&c.fanoutRuns, "fanout-runs", 300, "fanout phase: runs of 1 step, --fanout-width parallel steps, 1 step")
	fs.IntVar(&c.fanoutWidth, "fanout-width", 32, "fanout phase: parallel steps per run (jetflow.Go, then jetflow.AwaitAll)")
	fs.IntVar(&c.deepRuns, "deep-runs", 64, "deep phase: concurrent runs of --deep-steps sequential steps")
	fs.IntVar(&c.deepSteps, "deep-steps", 200, "deep phase: sequential steps per run")
	fs.IntVar(&c.shapeWorkers, "shape-workers", 1, "fanout and deep phases: workers (each with --concurrency slots, on its own connection)")
	fs.IntVar(&c.sleepers, "sleepers", 10000, "sleepers phase: runs that sleep (1 step, then Sleep --sleep)")
	fs.DurationVar(&c.sleep, "sleep", time.Hour, "sleepers phase: how long each run sleeps (whole seconds)")
	fs.IntVar(&c.wakeups, "wakeups", 10000, "wakeups phase: runs that sleep until one common due time")
	fs.DurationVar(&c.wakeLead, "wake-lead", 0, "wakeups phase: the due time is this long after the first start (0: 5s + 2ms a run)")
	fs.IntVar(&c.events, "events", 10000, "events phase: runs waiting for an event (--dup-frac of the events are sent twice)")
	fs.DurationVar(&c.waitWindow, "wait-window", 5*time.Second, "sleepers phase: how long the worker process is measured idle, and again while every run sleeps; waiters phase: how long a consumer count must stay unchanged to be read")
	fs.StringVar(&c.workerHeapProfile, "worker-heap-profile", "", "sleepers phase: the worker process writes its heap profile to this file while every run sleeps")
	fs.DurationVar(&c.workerStuckAfter, "worker-stuck-after", 0, "sleepers, wakeups, events: the worker process's StuckAfter (0: the default, 5m); the sweeper checks every waiting run once per StuckAfter")
	fs.IntVar(&c.indexRuns, "index-runs", 200000, "index phase: kept runs written through the run store (and its index)")
	fs.IntVar(&c.indexGoroutines, "index-goroutines", 64, "index phase: goroutines writing the runs")
	fs.IntVar(&c.indexSamples, "index-samples", 50, "index phase: times each page and count is measured (p50/p99)")
	fs.IntVar(&c.waiters, "waiters", 10000, "waiters phase: runs waited for at once with Client.WaitRun (each blocked in its first step until released)")
	fs.IntVar(&c.backlog, "backlog", 100000, "backlog phase: runs started with no worker, then drained by one worker process")
	fs.StringVar(&phases, "phases", strings.Join(defaultPhases, ","), "phases to run, comma separated: "+strings.Join(allPhases, ","))
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.quick {
		for _, p := range []*int{&c.runs, &c.pubN, &c.kvN, &c.admitN, &c.fanoutRuns, &c.deepRuns, &c.sleepers, &c.wakeups, &c.events, &c.indexRuns, &c.waiters, &c.backlog} {
			*p = max(1, *p/10)
		}
	}
	c.phases = make(map[string]bool)
	for _, p := range strings.Split(phases, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		known := false
		for _, q := range allPhases {
			known = known || p == q
		}
		if !known {
			return c, fmt.Errorf("unknown phase %q (known: %s)", p, strings.Join(allPhases, ","))
		}
		c.phases[p] = true
	}
	switch {
	case c.runs < 1 || c.starters < 1 || c.concurrency < 1 || c.pubN < 1 || c.kvN < 1 || c.kvG < 1 || c.admitN < 1 || c.admitG < 1 || c.repeat < 1 ||
		c.fanoutRuns < 1 || c.fanoutWidth < 1 || c.deepRuns < 1 || c.deepSteps < 2 || c.shapeWorkers < 1 ||
		c.sleepers < 1 || c.wakeups < 1 || c.events < 1 || c.indexRuns < 1 || c.indexGoroutines < 1 || c.indexSamples < 1 ||
		c.waiters < 1 || c.backlog < 1:
		return c, errors.New("counts must be at least 1")
	case c.sleep < time.Second || c.waitWindow <= 0 || c.wakeLead < 0:
		return c, errors.New("--sleep must be at least 1s, --wait-window positive, --wake-lead not negative")
	case c.startRate < 0:
		return c, errors.New("--start-rate must not be negative")
	case c.dupFrac < 0 || c.dupFrac > 1:
		return c, errors.New("--dup-frac must be within [0, 1]")
	}
	return c, nil
}

// env is the run's embedded server and the connections opened on it.
type env struct {
	srv   *natsserver.Server
	dir   string
	conns []*nats.Conn
}

func (e *env) conn(name string) (*nats.Conn, error) {
	nc, err := jetstream.Connect(e.srv.ClientURL(), "bench-"+name)
	if err != nil {
		return nil, err
	}
	e.conns = append(e.conns, nc)
	return nc, nil
}

func (e *env) close(keep bool) {
	for _, nc := range e.conns {
		nc.Close()
	}
	e.srv.Shutdown()
	if !keep {
		_ = os.RemoveAll(e.dir)
	}
}

func main() {
	if child, code := waitsWorkerMain(); child {
		os.Exit(code)
	}
	if len(os.Args) > 1 && (os.Args[1] == "soak" || os.Args[1] == "soak-worker") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		run := runSoak
		if os.Args[1] == "soak-worker" {
			run = runSoakWorker
		}
		if err := run(ctx, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			stop()
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench: FAILED:", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	dir, err := os.MkdirTemp("", "jetflow-bench-")
	if err != nil {
		return err
	}
	srv, err := natsserver.Start(natsserver.Config{DataDir: dir, Port: -1, SyncAlways: cfg.syncAlways})
	if err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	e := &env{srv: srv, dir: dir}
	defer e.close(cfg.keepData)

	nc, err := e.conn("info")
	if err != nil {
		return err
	}
	res := &results{cfg: cfg, serverVersion: nc.ConnectedServerVersion(), dataDir: dir}
	printHeader(res)

	var failures []error
	step := func(name string, rep int, fn func() (string, error)) {
		if !cfg.phases[name] || ctx.Err() != nil {
			return
		}
		t0 := time.Now()
		label := name
		if cfg.repeat > 1 {
			label = fmt.Sprintf("%s #%d", name, rep+1)
		}
		fmt.Printf("phase %-10s ...", label)
		var figure string
		var err error
		stopProfile := func() {}
		if name == cfg.profilePhase && rep == 0 {
			stopProfile, err = startProfile(cfg.cpuProfile)
		}
		if err == nil {
			figure, err = fn()
			stopProfile()
		}
		fmt.Printf(" %7s  %s\n", time.Since(t0).Round(time.Millisecond), figure)
		if err != nil {
			fmt.Printf("phase %s FAILED: %v\n", label, err)
			failures = append(failures, fmt.Errorf("%s: %w", label, err))
		}
	}
	for rep := range cfg.repeat {
		step("publish", rep, func() (string, error) {
			r, err := rawPublish(ctx, e, cfg)
			if err == nil {
				res.pubRates = append(res.pubRates, r)
			}
			return num(r) + " msgs/s", err
		})
		step("kv", rep, func() (string, error) {
			r, err := rawKVCreate(ctx, e, cfg)
			if err == nil {
				res.kvRates = append(res.kvRates, r)
			}
			return num(r) + " creates/s", err
		})
		e2eStep := func(name string, list *[]*e2eStats, measure func() (*e2eStats, error)) {
			step(name, rep, func() (string, error) {
				s, err := measure()
				if s == nil {
					return "", err
				}
				*list = append(*list, s)
				return num(s.runsPerSec()) + " runs/s", err
			})
		}
		label := func(name string) string { return name + "-" + strconv.Itoa(rep) }
		e2eStep("mini", &res.minis, func() (*e2eStats, error) {
			return rawProgram(ctx, e, cfg, miniDesign, passOpts(label("mini"), cfg, false))
		})
		e2eStep("e2e", &res.engines, func() (*e2eStats, error) {
			return engineE2E(ctx, e, cfg, passOpts(label("e2e"), cfg, false))
		})
		e2eStep("gated", &res.gateds, func() (*e2eStats, error) {
			return withOps(ctx, e, cfg, label("gated"), func(o e2eOpts) (*e2eStats, error) { return rawProgram(ctx, e, cfg, gatedDesign, o) })
		})
		e2eStep("api", &res.apis, func() (*e2eStats, error) {
			return withOps(ctx, e, cfg, label("api"), func(o e2eOpts) (*e2eStats, error) { return engineE2E(ctx, e, cfg, o) })
		})
		step("latency", rep, func() (string, error) {
			f, err := latencyPhase(ctx, e, cfg, label("lat"))
			if err == nil {
				latencyResults = append(latencyResults, f)
			}
			return "start p99 " + dur(f.api.calls.p99) + " jetflow, " + dur(f.gated.calls.p99) + " gated at " + num(f.rate) + " calls/s", err
		})
		step("waiters", rep, func() (string, error) {
			f, err := waitersPhase(ctx, e, cfg, label("wait"))
			if err == nil {
				waiterResults = append(waiterResults, f)
			}
			return fmt.Sprintf("consumers %d for 1 wait, %d for %s waits; %s waits completed/s", f.one, f.many, num(float64(f.n)), num(f.rate())), err
		})
		step("backlog", rep, func() (string, error) {
			f, err := backlogPhase(ctx, e, cfg, label("backlog"))
			if err == nil {
				backlogResults = append(backlogResults, f)
			}
			return num(f.rate()) + " runs drained/s, worker peak RSS " + mib(float64(f.peakRSS)), err
		})
		step("admit", rep, func() (string, error) {
			d, dup, err := engineAdmission(ctx, e, cfg, rep)
			if err == nil {
				res.admitDistinct = append(res.admitDistinct, d)
				res.admitDup = append(res.admitDup, dup)
			}
			return num(d) + " distinct/s, " + num(dup) + " duplicate/s", err
		})
		step("http", rep, func() (string, error) {
			f, err := engineHTTP(ctx, e, cfg, rep)
			if err == nil {
				httpResults = append(httpResults, f)
			}
			return num(f.httpDistinct) + " distinct/s, " + num(f.httpDup) + " duplicate/s over HTTP", err
		})
		step("taskkey", rep, func() (string, error) {
			f, err := engineTaskKey(ctx, e, cfg, rep)
			if err == nil {
				taskKeyResults = append(taskKeyResults, f)
			}
			return num(f.hit) + " hit steps/s, " + num(f.miss) + " real steps/s, " + num(f.plain) + " plain steps/s", err
		})
		step("fanout", rep, func() (string, error) {
			f, err := engineFanout(ctx, e, cfg, rep)
			if err == nil {
				fanoutResults = append(fanoutResults, f)
			}
			return num(f.shape.stepsPerSec()) + " fan-out steps/s, " + num(f.ref.stepsPerSec()) + " 3-step steps/s", err
		})
		step("deep", rep, func() (string, error) {
			f, err := engineDeep(ctx, e, cfg, rep)
			if err == nil {
				deepResults = append(deepResults, f)
			}
			return num(f.shape.stepsPerSec()) + " deep steps/s, " + num(f.ref.stepsPerSec()) + " 3-step steps/s", err
		})
		step("sleepers", rep, func() (string, error) {
			f, err := engineSleepers(ctx, e, cfg, rep)
			if err == nil {
				sleepResults = append(sleepResults, f)
			}
			return num(float64(f.n)) + " sleeping, " + num(f.bytesPerRun()) + " broker bytes/run, worker RSS " + mib(float64(f.idle.RSS)) + " idle -> " + mib(float64(f.sleeping.RSS)), err
		})
		step("wakeups", rep, func() (string, error) {
			f, err := engineWakeups(ctx, e, cfg, rep)
			if err == nil {
				wakeResults = append(wakeResults, f)
			}
			return num(f.engine.rate()) + " wake-ups/s, raw " + num(f.raw.wake.rate()) + " msgs/s", err
		})
		step("events", rep, func() (string, error) {
			f, err := engineEvents(ctx, e, cfg, rep)
			if err == nil {
				eventResults = append(eventResults, f)
			}
			return num(f.sendRate) + " sends/s, raw " + num(f.rawRate) + " req/s", err
		})
		if rep == 0 { // the index phase writes its run IDs once: it runs once
			step("index", rep, func() (string, error) {
				f, err := engineIndex(ctx, e, cfg)
				if err != nil {
					return "", err
				}
				indexResults = append(indexResults, f)
				return num(float64(f.n)/f.populate.Seconds()) + " runs written/s", nil
			})
			step("attrs", rep, func() (string, error) {
				f, err := engineAttrs(ctx, e, cfg)
				if err != nil {
					return "", err
				}
				attrResults = append(attrResults, f)
				return num(float64(f.n)/f.populate.Seconds()) + " runs with attributes written/s", nil
			})
		}
	}
	fmt.Println()

	printReport(os.Stdout, res)
	printIssue16Report(os.Stdout, res)
	printTaskKeyReport(os.Stdout, res)
	printHTTPReport(os.Stdout, res)
	printShapeReports(os.Stdout, res)
	printWaitsReport(os.Stdout, res)
	printIndexReport(os.Stdout, res)
	printAttrsReport(os.Stdout)
	if ctx.Err() != nil {
		failures = append(failures, ctx.Err())
	}
	return errors.Join(failures...)
}

func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// machine describes where the figures were taken.
func machine() string {
	return fmt.Sprintf("%s %s/%s, GOMAXPROCS=%d, NumCPU=%d", runtime.Version(), runtime.GOOS, runtime.GOARCH,
		runtime.GOMAXPROCS(0), runtime.NumCPU())
}
