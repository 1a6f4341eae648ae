package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// Never twice, in operation: while the worker that holds a step is alive, no
// other worker starts that step — not when all its slots are busy, not when
// workers with another AckWait join or leave.

// overlapProbe records, per step ID, how many executions run at once and
// at which attempts.
type overlapProbe struct {
	mu       sync.Mutex
	active   map[string]int
	overlaps []string
	attempts map[string][]int
}

func newOverlapProbe() *overlapProbe {
	return &overlapProbe{active: map[string]int{}, attempts: map[string][]int{}}
}

// enter marks the start of an execution; the returned func marks its end.
func (p *overlapProbe) enter(ctx context.Context) func() {
	info, _ := StepDetailsFrom(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active[info.StepID]++
	p.attempts[info.StepID] = append(p.attempts[info.StepID], info.Attempt)
	if p.active[info.StepID] > 1 {
		p.overlaps = append(p.overlaps, fmt.Sprintf("%s at attempt %d", info.StepID, info.Attempt))
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.active[info.StepID]--
	}
}

// check fails t if any step ran twice at once, ran more than once, or ran
// at an attempt other than 1.
func (p *overlapProbe) check(t *testing.T, wantSteps int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(t, p.overlaps, "steps ran twice at the same time on healthy workers")
	require.Len(t, p.attempts, wantSteps)
	for id, a := range p.attempts {
		require.Equal(t, []int{1}, a, "step %s ran at these attempts", id)
	}
}

// slowWorkflow runs two steps that each take d.
func slowWorkflow(name string, p *overlapProbe, d time.Duration) *Workflow[int, int] {
	step := func(ctx context.Context) (int, error) {
		defer p.enter(ctx)()
		select {
		case <-time.After(d):
			return 1, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		a, err := Step(ctx, "first", step)
		if err != nil {
			return 0, err
		}
		b, err := Step(ctx, "second", step)
		return in + a + b, err
	})
}

// A saturated worker: every slot of both workers is busy for longer than
// AckWait and a backlog waits. Tasks a worker has received must not be
// redelivered to the other one while it is healthy: each step runs once,
// at attempt 1.
func TestSaturatedWorkersNeverRunAStepTwice(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ackWait = time.Second
	probe := newOverlapProbe()
	wf := slowWorkflow("saturated", probe, 5*ackWait/2)
	env.worker(WorkerConfig{Concurrency: 8, AckWait: ackWait}, wf)
	env.worker(WorkerConfig{Concurrency: 8, AckWait: ackWait}, wf)
	c := env.client()

	const runs = 12
	var handles []*Handle[int]
	for i := range runs {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, i, WithRunID(fmt.Sprintf("sat-%d", i)))
		require.NoError(t, err)
		handles = append(handles, h)
	}
	// Each worker runs at most 2 start tasks at once (a quarter of its
	// slots), so the backlog drains in about runs/4 rounds of a step.
	wait := time.Duration(runs)*5*ackWait/2 + 30*time.Second
	for i, h := range handles {
		out, err := h.Result(ctxT(t, wait))
		require.NoError(t, err)
		require.Equal(t, i+2, out)
	}
	probe.check(t, 2*runs)
}

// A worker started with a shorter AckWait (and stopped again, as in a
// rolled-back deploy) does not shorten the deadline of the steps a healthy
// worker is running: the consumer's AckWait is the deployment's.
func TestWorkerWithAnotherAckWaitDoesNotImposeIt(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ackWait = 1500 * time.Millisecond
	probe := newOverlapProbe()
	wf := slowWorkflow("skew", probe, 4*ackWait)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: ackWait}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("skew-1"))
	require.NoError(t, err)
	waitActive(t, probe, "skew-1.first.0")

	short := startWorker(t, env.conn(), WorkerConfig{Concurrency: 4, AckWait: 300 * time.Millisecond, Topology: env.topo}, wf)
	cons, err := c.assets.JS.Consumer(ctxT(t, 5*time.Second), jetstream.TasksStream, jetstream.ConsumerName("skew", jetstream.BranchTasks))
	require.NoError(t, err)
	require.Equal(t, ackWait, cons.CachedInfo().Config.AckWait, "a joining worker changed the deployment's AckWait")
	require.NoError(t, short.Stop(ctxT(t, 20*time.Second)))

	out, err := h.Result(ctxT(t, 30*ackWait))
	require.NoError(t, err)
	require.Equal(t, 2, out)
	probe.check(t, 2)
}

// An operator lowers the deployment's AckWait on purpose (ApplyAckWait)
// while a long step runs: the running worker follows the announcement
// before the deadline shrinks, so its step is not redelivered.
func TestLoweringAckWaitIsFollowedByRunningWorkers(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	// lower is a real lowering, yet long enough that the running worker's
	// heartbeat (every lower/3) outlasts the scheduling stalls of the whole
	// race-enabled suite on 2 cores: at 300ms, one in a few full runs saw a
	// stall longer than the deadline, a redelivery no worker could prevent.
	const ackWait, lower = 1500 * time.Millisecond, 600 * time.Millisecond
	probe := newOverlapProbe()
	wf := slowWorkflow("lower", probe, 4*ackWait)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: ackWait}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("low-1"))
	require.NoError(t, err)
	waitActive(t, probe, "low-1.first.0")

	// Start returns once the lower value is applied.
	env.worker(WorkerConfig{Concurrency: 4, AckWait: lower, ApplyAckWait: true}, wf)
	for _, kind := range []jetstream.TaskKind{jetstream.RunTasks, jetstream.BranchTasks} {
		cons, err := c.assets.JS.Consumer(ctxT(t, 5*time.Second), jetstream.TasksStream, jetstream.ConsumerName("lower", kind))
		require.NoError(t, err)
		require.Equal(t, lower, cons.CachedInfo().Config.AckWait)
		require.Empty(t, cons.CachedInfo().Config.Metadata[jetstream.LoweringMetadata])
	}

	out, err := h.Result(ctxT(t, 30*ackWait))
	require.NoError(t, err)
	require.Equal(t, 2, out)
	probe.check(t, 2)
}

// waitActive waits until stepID is running.
func waitActive(t *testing.T, p *overlapProbe, stepID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.active[stepID] > 0
	}, 20*time.Second, 5*time.Millisecond, "step %s did not start", stepID)
}

// A downstream outage: one step of many runs fails and backs off for an
// hour. Its retries wait as timers, not as ack-pending tasks, so they
// cannot fill the consumer's MaxAckPending (64 × Concurrency) and stop
// other runs of the same workflow.
func TestLongBackoffDoesNotStallOtherRuns(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("outage", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "call", func(context.Context) (int, error) {
			if in < 0 {
				return 0, RetryAfter(errors.New("dependency down"), time.Hour)
			}
			return in, nil
		})
	})
	// Concurrency 1: the consumer allows 64 tasks ack-pending.
	env.worker(WorkerConfig{Concurrency: 1}, wf)
	c := env.client()
	const failing = 70
	for i := range failing {
		_, err := Start(ctxT(t, 10*time.Second), c, wf, -1, WithRunID(fmt.Sprintf("down-%d", i)))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		info, err := c.assets.Timers.Info(context.Background())
		return err == nil && info.State.Msgs == failing
	}, 60*time.Second, 10*time.Millisecond, "the failing runs did not all wait as timers")

	for i := range 3 {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, i+1, WithRunID(fmt.Sprintf("up-%d", i)))
		require.NoError(t, err)
		out, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err, "a healthy run stalled behind the backoffs")
		require.Equal(t, i+1, out)
	}
	run, err := c.GetRun(ctxT(t, 5*time.Second), "down-0")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)
}

// A retry after a long backoff runs once the backoff has passed, never
// before, with the next attempt number.
func TestRetryTimerRunsTheNextAttemptAfterItsBackoff(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const backoff = 2 * time.Second
	var (
		mu    sync.Mutex
		calls []time.Time
		seen  []int
	)
	wf := NewWorkflow("later", func(ctx *Context, _ int) (int, error) {
		return Step(ctx, "call", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Now())
			seen = append(seen, info.Attempt)
			if info.Attempt < 3 {
				return 0, RetryAfter(errors.New("not yet"), backoff)
			}
			return info.Attempt, nil
		})
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("later-1"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 10*backoff+30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 3, out)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2, 3}, seen)
	for i := 1; i < len(calls); i++ {
		require.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), backoff, "attempt %d ran early", seen[i])
	}
	steps, err := c.Steps(ctxT(t, 5*time.Second), "later-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, 3, steps[0].Attempt)
}

// While a step waits for its retry timer, a task published for it by
// anyone else — here the start task a producer of the previous version
// published for a duplicate start after the broker's window, which finds
// the run parked — must not run it early: the timer owns the next attempt.
func TestRetryTimerIsNotOvertakenByARedispatch(t *testing.T) {
	t.Parallel()
	for _, failing := range []string{"first", "second"} {
		t.Run(failing, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t, Topology{DuplicateWindow: 100 * time.Millisecond})
			const backoff = 3 * time.Second
			var (
				mu    sync.Mutex
				calls []time.Time
				seen  []int
			)
			failed := make(chan struct{}, 4)
			step := func(name string) func(context.Context) (int, error) {
				return func(sctx context.Context) (int, error) {
					if name != failing {
						return 1, nil
					}
					info, _ := StepDetailsFrom(sctx)
					mu.Lock()
					defer mu.Unlock()
					calls = append(calls, time.Now())
					seen = append(seen, info.Attempt)
					if info.Attempt < 2 {
						failed <- struct{}{}
						return 0, RetryAfter(errors.New("not yet"), backoff)
					}
					return 1, nil
				}
			}
			wf := NewWorkflow("overtake", func(ctx *Context, _ int) (int, error) {
				a, err := Step(ctx, "first", step("first"))
				if err != nil {
					return 0, err
				}
				b, err := Step(ctx, "second", step("second"))
				return a + b, err
			})
			env.worker(WorkerConfig{}, wf)
			c := env.client()
			h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("ot-1"))
			require.NoError(t, err)
			<-failed
			// A duplicate start past the broker's window, as a producer of
			// the previous version made it: its start task stored.
			publishEarlierStart(t, c, "overtake", "ot-1", json.RawMessage(`0`))
			out, err := h.Result(ctxT(t, 10*backoff+30*time.Second))
			require.NoError(t, err)
			require.Equal(t, 2, out)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []int{1, 2}, seen, "the step ran before its retry timer")
			require.GreaterOrEqual(t, calls[1].Sub(calls[0]), backoff)
		})
	}
}
