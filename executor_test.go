package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/sweep"
	"github.com/jetflow/jetflow/internal/workflow"
)

// The tests of this file hold one executor per run (G6+): at any moment
// one worker executes a run's body, and nothing that wakes a run — an
// event, a child's end, a branch's commit, a due timer, a redelivery —
// starts a step that a live holder runs or waits to retry.

// steps is a side-effect ledger: every start of a step function, by step
// ID, with its attempt and when it started.
type steps struct {
	mu     sync.Mutex
	starts map[string][]stepStart
}

type stepStart struct {
	attempt int
	at      time.Time
}

func newSteps() *steps { return &steps{starts: make(map[string][]stepStart)} }

// record notes the start of the step running with ctx.
func (s *steps) record(ctx context.Context) StepDetails {
	info, _ := StepDetailsFrom(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts[info.StepID] = append(s.starts[info.StepID], stepStart{info.Attempt, time.Now()})
	return info
}

func (s *steps) of(stepID string) []stepStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stepStart(nil), s.starts[stepID]...)
}

// once requires every step of ids to have started exactly once.
func (s *steps) once(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.Len(t, s.of(id), 1, "step %s started %d times", id, len(s.of(id)))
	}
}

// gate is a step function's brake: started is told (once) when the step
// runs, and the step waits for release.
type gate struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{started: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) hold(ctx context.Context) error {
	g.once.Do(func() { close(g.started) })
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// An event sent while the run's first step runs, before the run reaches
// its wait, is kept for the wait: it wakes nothing that could start the
// first step a second time (the holder's run task absorbs the wake), and
// the run goes on with it when the step returns.
func TestEarlyEventStartsNoStepAgain(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ledger, first := newSteps(), newGate()
	wf := NewWorkflow("early", func(ctx *Context, _ int) (string, error) {
		if _, err := Step(ctx, "first", func(sctx context.Context) (int, error) {
			ledger.record(sctx)
			return 1, first.hold(sctx)
		}); err != nil {
			return "", err
		}
		ev, err := WaitEvent[string](ctx, "go")
		if err != nil {
			return "", err
		}
		_, err = Step(ctx, "after", func(sctx context.Context) (int, error) { ledger.record(sctx); return 2, nil })
		return ev, err
	}, WithEvent[string]("go"))
	const ackWait = 2 * time.Second
	env.worker(WorkerConfig{AckWait: ackWait}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("early-1"))
	require.NoError(t, err)
	<-first.started
	res, err := c.SendEvent(ctx, "early-1", "go", "ev-1", json.RawMessage(`"payload"`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	// Whatever the event woke has been delivered (nothing waits in the
	// stream); a second start of the first step shows within a moment.
	require.Eventually(t, func() bool {
		info, err := c.assets.Tasks.Info(ctx)
		return err == nil && info.State.Msgs <= 2
	}, 10*time.Second, 10*time.Millisecond)
	require.Never(t, func() bool { return len(ledger.of("early-1.first.0")) > 1 }, ackWait/4, 10*time.Millisecond,
		"the first step started again while it ran")
	close(first.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "payload", out)
	ledger.once(t, "early-1.first.0", "early-1.after.0")
}

// Forty sends of one event while the run's first step runs: one is
// delivered, the others are duplicates, and no step starts twice.
func TestEventStormBeforeTheWait(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ledger, first := newSteps(), newGate()
	wf := NewWorkflow("storm", func(ctx *Context, _ int) (string, error) {
		if _, err := Step(ctx, "first", func(sctx context.Context) (int, error) {
			ledger.record(sctx)
			return 1, first.hold(sctx)
		}); err != nil {
			return "", err
		}
		return WaitEvent[string](ctx, "go")
	}, WithEvent[string]("go"))
	env.worker(WorkerConfig{AckWait: 2 * time.Second}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("storm-1"))
	require.NoError(t, err)
	<-first.started
	var delivered, duplicates atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			res, err := c.SendEvent(ctx, "storm-1", "go", "ev-1", json.RawMessage(`"x"`))
			if err != nil {
				t.Errorf("send: %v", err)
				return
			}
			switch res.Outcome {
			case EventDelivered:
				delivered.Add(1)
			case EventDuplicate:
				duplicates.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, delivered.Load())
	require.EqualValues(t, 39, duplicates.Load())
	close(first.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "x", out)
	ledger.once(t, "storm-1.first.0")
}

// A child run that ends while its parent's first branch still runs wakes
// the parent, which waits for the branch: the branch does not start again.
func TestChildEndDuringALongBranchStartsNoStepAgain(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ledger, long := newSteps(), newGate()
	kidDone := make(chan struct{})
	kid := NewWorkflow("quick-kid", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "k", func(sctx context.Context) (int, error) { ledger.record(sctx); return in + 1, nil })
	})
	parent := NewWorkflow("long-parent", func(ctx *Context, _ int) (int, error) {
		branch := Go(ctx, "long", func(sctx context.Context) (int, error) {
			ledger.record(sctx)
			return 10, long.hold(sctx)
		})
		child := Child(ctx, kid, 1)
		k, err := child.Get(ctx)
		if err != nil {
			return 0, err
		}
		b, err := branch.Get(ctx)
		return k + b, err
	})
	env.worker(WorkerConfig{AckWait: 2 * time.Second, hooks: workflow.Hooks{
		AfterFinish: func(runID string) {
			if runID == "lp-1=quick-kid=0" {
				close(kidDone)
			}
		},
	}}, parent, kid)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, parent, 0, WithRunID("lp-1"))
	require.NoError(t, err)
	<-long.started
	<-kidDone
	// The child's end woke the parent, which found the branch running and
	// parked again; only then does the branch return.
	require.Eventually(t, func() bool {
		steps, err := c.Steps(ctx, "lp-1")
		return err == nil && len(steps) == 1 && steps[0].Child != ""
	}, 10*time.Second, 10*time.Millisecond)
	close(long.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 12, out)
	ledger.once(t, "lp-1.long.0", "lp-1=quick-kid=0.k.0")
}

// An event that arrives while the run's first step waits out a retry
// delay (RetryAfter) wakes the run, which finds the retry's time not come
// and parks: the retry starts once, as attempt 2, not before its delay.
func TestEventDuringARetryDelayStartsNoEarlyRetry(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const delay = 3 * time.Second
	ledger := newSteps()
	failed := make(chan time.Time, 1)
	wf := NewWorkflow("backoff", func(ctx *Context, _ int) (string, error) {
		if _, err := Step(ctx, "first", func(sctx context.Context) (int, error) {
			if info := ledger.record(sctx); info.Attempt == 1 {
				failed <- time.Now()
				return 0, RetryAfter(errors.New("busy"), delay)
			}
			return 1, nil
		}); err != nil {
			return "", err
		}
		return WaitEvent[string](ctx, "go")
	}, WithEvent[string]("go"))
	env.worker(WorkerConfig{AckWait: 2 * time.Second}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("bo-1"))
	require.NoError(t, err)
	at := <-failed
	// The run parks on its retry timer; the event wakes it meanwhile.
	require.Eventually(t, func() bool {
		open, err := c.OpenSteps(ctx, "bo-1")
		return err == nil && len(open) == 1
	}, 10*time.Second, 10*time.Millisecond)
	res, err := c.SendEvent(ctx, "bo-1", "go", "ev-1", json.RawMessage(`"late"`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "late", out)
	starts := ledger.of("bo-1.first.0")
	require.Len(t, starts, 2)
	require.Equal(t, []int{1, 2}, []int{starts[0].attempt, starts[1].attempt})
	require.GreaterOrEqual(t, starts[1].at.Sub(at), delay-100*time.Millisecond, "the retry started before its delay")
}

// A worker whose heartbeats to the broker are lost, while it lives and
// renews its lease: the broker redelivers its run task to another worker,
// which finds a committed step and a live lease, and waits instead of
// running anything. Every step runs once.
func TestLostHeartbeatsStartNoStepTwice(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ackWait = 500 * time.Millisecond
	ledger, long := newSteps(), newGate()
	wf := NewWorkflow("deaf", func(ctx *Context, _ int) (int, error) {
		sum := 0
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				ledger.record(sctx)
				if name == "b" {
					return 1, long.hold(sctx)
				}
				return 1, nil
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	env.worker(WorkerConfig{AckWait: ackWait, hooks: workflow.Hooks{NoAckExtension: true}}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second+60*ackWait)
	h, err := Start(ctx, c, wf, 0, WithRunID("deaf-1"))
	require.NoError(t, err)
	<-long.started
	// A healthy worker joins; the task is redelivered every AckWait while
	// b runs for many of them.
	env.worker(WorkerConfig{AckWait: ackWait}, wf)
	cons, err := c.assets.JS.Consumer(ctx, "JETFLOW_TASKS", "jetflow_run_deaf")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumRedelivered > 0
	}, 20*ackWait, ackWait/10, "the run task was never redelivered")
	deadline := time.Now().Add(6 * ackWait)
	for time.Now().Before(deadline) {
		require.Len(t, ledger.of("deaf-1.b.0"), 1, "b started again while its holder lived")
		require.Empty(t, ledger.of("deaf-1.c.0"), "c started while b ran")
		time.Sleep(ackWait / 10)
	}
	close(long.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, out)
	ledger.once(t, "deaf-1.a.0", "deaf-1.b.0", "deaf-1.c.0")
}

// A duplicate start after the broker's duplicate window, while the run
// waits, publishes nothing (the window forgot the run ID, and the run
// record answers): the run is not woken, and no step runs again.
func TestDuplicateStartAfterTheWindowRunsNothingAgain(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Millisecond
	env := newEnv(t, Topology{DuplicateWindow: window})
	ledger := newSteps()
	parked := make(chan string, 8)
	wf := NewWorkflow("late-dup", func(ctx *Context, _ int) (string, error) {
		if _, err := Step(ctx, "first", func(sctx context.Context) (int, error) { ledger.record(sctx); return 1, nil }); err != nil {
			return "", err
		}
		return WaitEvent[string](ctx, "go")
	}, WithEvent[string]("go"))
	env.worker(WorkerConfig{hooks: workflow.Hooks{AfterPark: func(runID string, _ []string) { parked <- runID }}}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("ld-1"))
	require.NoError(t, err)
	require.Equal(t, "ld-1", <-parked)
	awaitWindowPassed(t, c)
	dup, err := Start(ctx, c, wf, 0, WithRunID("ld-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, dup.Outcome)
	require.Zero(t, runTasks(t, c, "late-dup", "ld-1"), "the duplicate stored a task")
	_, err = c.SendEvent(ctx, "ld-1", "go", "ev-1", json.RawMessage(`"done"`))
	require.NoError(t, err)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "done", out)
	require.Empty(t, parked, "the duplicate woke the run, which parked again")
	ledger.once(t, "ld-1.first.0")
}

// A parent that waits for its child ten times the sweeper's StuckAfter
// is never taken for stuck: its wait leaves a recheck timer.
func TestParentWaitingForItsChildIsNotStuck(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ackWait = 100 * time.Millisecond
	stuckAfter := sweep.AckWaits * ackWait
	hold := newGate()
	kid := NewWorkflow("slow-kid", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "k", func(sctx context.Context) (int, error) { return in, hold.hold(sctx) })
	})
	parent := NewWorkflow("patient", func(ctx *Context, _ int) (int, error) {
		return Child(ctx, kid, 7).Get(ctx)
	})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	var passes atomic.Int64
	env.worker(WorkerConfig{AckWait: ackWait, SweepInterval: 20 * time.Millisecond, StuckAfter: stuckAfter, Metrics: m,
		sweepHook: func(p sweep.Pass) {
			passes.Add(1)
			for _, id := range p.Redispatched {
				t.Errorf("run %s taken for stuck", id)
			}
		}}, parent, kid)
	c := env.client()
	ctx := ctxT(t, 30*time.Second+20*stuckAfter)
	h, err := Start(ctx, c, parent, 0, WithRunID("pat-1"))
	require.NoError(t, err)
	<-hold.started
	waitUntil := time.Now().Add(10 * stuckAfter)
	require.Eventually(t, func() bool { return time.Now().After(waitUntil) && passes.Load() > 10 }, 20*stuckAfter, ackWait)
	close(hold.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, out)
	require.Zero(t, counterSum(t, reg, metrics.NameRunsStuck), "jetflow_runs_stuck_total")
}

// counterSum is the sum of every series of the counter called name.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// stopWorkflow (child workers) runs steps a, b, c; b's first attempt
// reports its start and then takes a while, long enough for the test to
// stop the process in it. A commit the process makes that is refused is
// reported as the effect "refused:<step ID>".
func stopWorkflow(effectsURL string) *Workflow[int, int] {
	return NewWorkflow("stopper", func(ctx *Context, _ int) (int, error) {
		sum := 0
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				if err := reportEffect(sctx, effectsURL, info); err != nil {
					return 0, err
				}
				if name == "b" && info.Attempt == 1 {
					time.Sleep(2 * childAckWait) // stopped in here
				}
				return 1, nil
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
}

func init() {
	childExtras = append(childExtras, func(crash, effects string, cfg *WorkerConfig) []Registrable {
		switch crash {
		case "stop-holder":
			cfg.hooks.AfterCommit = func(stepID string, won bool) {
				if !won {
					_ = reportEffect(context.Background(), effects, StepDetails{StepID: "refused:" + stepID, Attempt: 1})
				}
			}
		case "after-finish":
			cfg.hooks.AfterFinish = func(runID string) {
				if runID == "crash-1" {
					killSelf()
				}
			}
		}
		return []Registrable{stopWorkflow(effects)}
	})
}

// A holder stopped (SIGSTOP) past its lease in a step, then resumed once
// another worker took the run over and finished it: its late commit is
// refused, and it starts no further step.
func TestStoppedHolderCommitsAndStartsNothing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects, effectsURL := newEffectServer(t)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	holder := startChild(t, env, "stop-holder", effectsURL)
	require.NoError(t, waitReady(holder, 30*time.Second))
	h, err := Start(ctx, c, stopWorkflow(effectsURL), 0, WithRunID("stop-1"))
	require.NoError(t, err)
	waitEffect(t, effects, "stop-1.b.0", 30*time.Second)
	require.NoError(t, holder.Process.Signal(syscall.SIGSTOP))

	taker := startChild(t, env, "", effectsURL)
	require.NoError(t, waitReady(taker, 30*time.Second))
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, out)
	steps, err := c.Steps(ctx, "stop-1")
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, 2, steps[1].Attempt, "b's record is the taker's attempt")

	require.NoError(t, holder.Process.Signal(syscall.SIGCONT))
	waitEffect(t, effects, "refused:stop-1.b.0", 10*childAckWait)
	// It started nothing after its refused commit: c ran once, by the
	// taker; and b's record is still the taker's.
	deadline := time.Now().Add(3 * childAckWait)
	for time.Now().Before(deadline) {
		require.Equal(t, []int{1}, effects.get("stop-1.c.0"), "c started again")
		time.Sleep(childAckWait / 10)
	}
	require.Equal(t, []int{1, 2}, effects.get("stop-1.b.0"))
	after, err := c.Steps(ctx, "stop-1")
	require.NoError(t, err)
	require.Equal(t, steps, after, "the stopped holder changed a committed step")
}

// waitEffect waits until the effects server has seen stepID.
func waitEffect(t *testing.T, effects *effectLog, stepID string, d time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return len(effects.get(stepID)) > 0 }, d, 5*time.Millisecond, "no effect of %s", stepID)
}

// killedAfterTheEnd runs crash-1 of the crash workflow on a child worker
// process in crash mode (one that dies once the run's end is written) and
// waits for the kill and the run's result.
func killedAfterTheEnd(t *testing.T, crash string) (*testEnv, *Client, *effectLog, string) {
	t.Helper()
	env := newEnv(t, Topology{})
	effects, effectsURL := newEffectServer(t)
	c := env.client()
	first := startChild(t, env, crash, effectsURL)
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, crashWorkflow(effectsURL, nil), 0, WithRunID("crash-1"))
	require.NoError(t, err)
	waitKilled(t, first, 30*time.Second)
	out, err := h.Result(ctx)
	require.NoError(t, err, "the end was written before the kill")
	require.Equal(t, 3, out)
	return env, c, effects, effectsURL
}

// A worker killed after it wrote its run's end, before it acknowledged the
// run task: the task's redelivery finds the run ended and does nothing.
func TestWorkerKilledAfterTheRunsEnd(t *testing.T) {
	t.Parallel()
	env, c, effects, effectsURL := killedAfterTheEnd(t, "after-finish")
	ctx := ctxT(t, 60*time.Second)

	startChild(t, env, "", effectsURL)
	waitTasksDrained(t, c)
	for _, s := range []string{"a", "b", "c"} {
		require.Equal(t, []int{1}, effects.get("crash-1."+s+".0"), "step %s", s)
	}
	run, err := c.GetRun(ctx, "crash-1")
	require.NoError(t, err)
	require.JSONEq(t, `3`, string(run.Output))
}

// A worker killed after it wrote its run's end and before it wrote the
// run's index entry: the run's record is right, its index entry still says
// running. The task's redelivery, finding the run ended, writes the entry:
// the run is counted and listed as completed, and no longer as running.
func TestIndexWriteLostWithItsWorker(t *testing.T) {
	t.Parallel()
	env, c, effects, effectsURL := killedAfterTheEnd(t, "before-index")
	ctx := ctxT(t, 60*time.Second)
	counts, err := c.CountRuns(ctx, "crashy")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Running: 1}, counts, "the index entry was written before the kill")

	startChild(t, env, "", effectsURL)
	waitTasksDrained(t, c)
	require.Eventually(t, func() bool {
		counts, err := c.CountRuns(ctx, "crashy")
		return err == nil && counts == RunCounts{Completed: 1}
	}, 10*childAckWait, childAckWait/20, "the run is still counted as running")
	page, err := c.ListRuns(ctx, ListOptions{Workflow: "crashy", Status: StatusCompleted})
	require.NoError(t, err)
	require.Equal(t, []string{"crash-1"}, runIDs(page.Runs))
	for _, s := range []string{"a", "b", "c"} {
		require.Equal(t, []int{1}, effects.get("crash-1."+s+".0"), "step %s", s)
	}
}

// TestFreshRunCostsNoLeaseWrite: a run whose holder finishes within a
// third of its AckWait writes no lease record (its fence is "no record"),
// and a run that parks writes one, parked at the await it waits at.
func TestFreshRunCostsNoLeaseWrite(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("leaseless", func(ctx *Context, wait bool) (int, error) {
		v, err := Step(ctx, "a", func(context.Context) (int, error) { return 1, nil })
		if err != nil || !wait {
			return v, err
		}
		_, err = WaitEvent[int](ctx, "go")
		return v, err
	}, WithEvent[int]("go"))
	parked := make(chan []string, 1)
	env.worker(WorkerConfig{AckWait: 30 * time.Second, hooks: workflow.Hooks{AfterPark: func(_ string, waits []string) { parked <- waits }}}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, false, WithRunID("ll-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	_, _, err = c.assets.Steps.Get(ctx, "ll-1.lease")
	require.ErrorIs(t, err, jetstream.ErrNotFound, "a fresh run wrote a lease record")

	h, err = Start(ctx, c, wf, true, WithRunID("ll-2"))
	require.NoError(t, err)
	require.Equal(t, []string{"ll-2.event=go.0"}, <-parked)
	v, _, err := c.assets.Steps.Get(ctx, "ll-2.lease")
	require.NoError(t, err)
	require.Contains(t, string(v), `"state":"parked"`)
	require.Contains(t, string(v), `"epoch":2`)
	_, err = c.SendEvent(ctx, "ll-2", "go", "e", json.RawMessage(`1`))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
}

// A run handed over at a step boundary by a draining worker is taken by
// the next delivery of its task without a lease write. That holder stalls
// in its step (no heartbeat, no renewal) past AckWait, and the broker
// delivers the task once more, to a healthy worker. The later delivery
// must not take the run at the same lease revision: it takes the lease
// over with a write, so the stalled holder's late commit is refused and
// the step's record is written once.
func TestStalledTakerOfAHandedOverRunIsFenced(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ackWait = time.Second
	ledger, first, stall, last := newSteps(), newGate(), newGate(), newGate()
	var stalls atomic.Bool
	wf := NewWorkflow("handed", func(ctx *Context, _ int) (int, error) {
		sum := 0
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				ledger.record(sctx)
				switch {
				case name == "a":
					return 1, first.hold(sctx)
				case name == "c":
					return 1, last.hold(sctx)
				case stalls.CompareAndSwap(false, true):
					stall.once.Do(func() { close(stall.started) })
					<-stall.release // a stalled process: deaf to its context
				}
				return 1, nil
			})
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	c := env.client()
	ctx := ctxT(t, 30*time.Second+20*ackWait)
	drained := env.worker(WorkerConfig{AckWait: ackWait}, wf)
	h, err := Start(ctx, c, wf, 0, WithRunID("handed-1"))
	require.NoError(t, err)
	<-first.started

	stopped := make(chan error, 1)
	go func() { stopped <- drained.Stop(ctx) }()
	require.Eventually(t, func() bool { return drained.Ready(ctx) != nil }, 10*time.Second, time.Millisecond, "the worker never began to drain")
	late := make(chan bool, 1)
	env.worker(WorkerConfig{AckWait: ackWait, Concurrency: 1, hooks: workflow.Hooks{NoHeartbeat: true,
		AfterCommit: func(stepID string, won bool) {
			if stepID == "handed-1.b.0" {
				late <- won
			}
		}}}, wf)
	close(first.release) // a commits; the drained worker hands the run over before b
	require.NoError(t, <-stopped)
	<-stall.started // the stalled worker took the run and started b

	// The taker renews nothing while it runs c either: no write of its own
	// but the take can fence the stalled holder.
	env.worker(WorkerConfig{AckWait: ackWait, hooks: workflow.Hooks{NoHeartbeat: true}}, wf)
	<-last.started // the taker took the run, committed b and runs c
	_, rev, err := c.assets.Steps.Get(ctx, "handed-1.b.0")
	require.NoError(t, err)

	close(stall.release)
	select {
	case won := <-late:
		require.False(t, won, "the stalled holder's late commit of b was accepted")
	case <-ctx.Done():
		t.Fatal("the stalled holder never tried to commit b")
	}
	_, after, err := c.assets.Steps.Get(ctx, "handed-1.b.0")
	require.NoError(t, err)
	require.Equal(t, rev, after, "b's record was written again")
	require.Len(t, ledger.of("handed-1.b.0"), 2)

	close(last.release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, out)
	ledger.once(t, "handed-1.a.0")
}

// A run parked on AwaitAll over eight branches is woken once, by the last
// of them to commit: a branch that commits while others are missing
// leaves the run parked (a wake would only replay the body to park it
// again). Branches commit one after another here, each once the one
// before it has committed.
func TestBranchesWakeTheirRunOnce(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const width = 8
	gates := make([]chan struct{}, width)
	for i := range gates {
		gates[i] = make(chan struct{})
	}
	wf := NewWorkflow("fan", func(ctx *Context, _ int) (int, error) {
		fs := make([]Awaitable, width)
		outs := make([]*Future[int], width)
		for i := range width {
			outs[i] = Go(ctx, fmt.Sprintf("b%d", i), func(sctx context.Context) (int, error) {
				select {
				case <-gates[i]:
					return i, nil
				case <-sctx.Done():
					return 0, sctx.Err()
				}
			})
			fs[i] = outs[i]
		}
		if err := AwaitAll(ctx, fs...); err != nil {
			return 0, err
		}
		sum := 0
		for _, f := range outs {
			v, err := f.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
	var parks atomic.Int64
	parked := make(chan struct{}, 1)
	committed := make(chan string, width)
	env.worker(WorkerConfig{hooks: workflow.Hooks{
		AfterPark: func(string, []string) {
			parks.Add(1)
			select {
			case parked <- struct{}{}:
			default:
			}
		},
		AfterCommit: func(stepID string, won bool) {
			if won {
				committed <- stepID
			}
		},
	}}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("fan-1"))
	require.NoError(t, err)
	<-parked
	for i := range width {
		close(gates[i])
		select {
		case id := <-committed:
			require.Equal(t, fmt.Sprintf("fan-1.b%d.0", i), id)
		case <-ctx.Done():
			t.Fatalf("branch %d never committed", i)
		}
	}
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, width*(width-1)/2, out)
	require.Equal(t, int64(1), parks.Load(), "the run was woken by a branch while others were missing")
}
