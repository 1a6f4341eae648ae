package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/workflow"
)

// A start of another workflow under a running run's ID, after the broker's
// window, must neither take the run over nor be told it created anything;
// and a start task of the other workflow under that run ID (a producer of
// the previous version published one for every start) is dropped by its
// worker.
func TestStartOfAnotherWorkflowCannotTakeOverARun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: 200 * time.Millisecond})
	release := make(chan struct{})
	started := make(chan StepDetails, 1)
	effects := newCounter()
	a := blockingWorkflow(started, release, effects)
	b := NewWorkflow("other", func(ctx *Context, in string) (string, error) {
		return Step(ctx, "slow", func(context.Context) (string, error) {
			effects.inc("other")
			return "hijacked " + in, nil
		})
	})
	env.worker(WorkerConfig{}, a, b)
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, a, 0, WithRunID("shared-1"))
	require.NoError(t, err)
	<-started
	awaitWindowPassed(t, c)

	admit := dedupe.New(c.assets, dedupe.Config{})
	_, err = admit.Admit(context.Background(), dedupe.Request{RunID: "shared-1", Workflow: "other", Input: json.RawMessage(`"x"`)})
	require.ErrorIs(t, err, ErrIdempotencyConflict)
	var ce *dedupe.ConflictError // the admitter's own error: the test calls it directly
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "blocking", ce.Stored)
	require.Equal(t, "other", ce.Requested)
	publishEarlierStart(t, c, "other", "shared-1", json.RawMessage(`"x"`))
	_, err = c.StartByName(ctxT(t, 5*time.Second), "other", json.RawMessage(`"y"`), WithRunID("shared-1"))
	require.ErrorIs(t, err, ErrIdempotencyConflict)

	close(release)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "done", out)
	waitTasksDrained(t, c)
	require.Zero(t, effects.get("other"), "the other workflow's body ran on this run")
	run, err := c.GetRun(ctxT(t, 5*time.Second), "shared-1")
	require.NoError(t, err)
	require.Equal(t, "blocking", run.Workflow)
	require.JSONEq(t, `"done"`, string(run.Output))
}

// A task that waits in a worker's buffer for a free slot keeps its ack
// deadline extended: it is not redelivered to another worker while it waits,
// and so never runs twice at once.
func TestBufferedTaskIsNotRunTwice(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	releaseFirst := make(chan struct{})
	releaseSecond := make(chan struct{})
	first := make(chan struct{}, 8)
	secondStarted := make(chan struct{}, 8)
	wf := NewWorkflow("queued", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "work", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			if in == 0 {
				first <- struct{}{}
				<-releaseFirst
			} else {
				secondStarted <- struct{}{}
				<-releaseSecond
			}
			return in, nil
		})
	})
	const ackWait = 300 * time.Millisecond
	env.worker(WorkerConfig{Concurrency: 1, AckWait: ackWait}, wf)
	c := env.client()
	_, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("q-0"))
	require.NoError(t, err)
	<-first // the only slot is taken
	h1, err := Start(ctxT(t, 5*time.Second), c, wf, 1, WithRunID("q-1"))
	require.NoError(t, err)
	env.worker(WorkerConfig{Concurrency: 4, AckWait: ackWait}, wf)

	// q-1 waits behind q-0 for several ack deadlines, then runs for several
	// more: it must start exactly once in all that time.
	deadline := time.After(5 * ackWait)
	starts := 0
	for waiting := true; waiting; {
		select {
		case <-secondStarted:
			starts++
		case <-deadline:
			waiting = false
		}
	}
	close(releaseFirst)
	deadline = time.After(5 * ackWait)
	for waiting := true; waiting; {
		select {
		case <-secondStarted:
			starts++
		case <-deadline:
			waiting = false
		}
	}
	close(releaseSecond)
	require.Equal(t, 1, starts, "the task of q-1 ran more than once at the same time")
	_, err = h1.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	waitTasksDrained(t, c)
	require.Equal(t, 1, effects.get("q-1.work.0"))
}

// Tasks handed back unstarted when a worker stops do not use up attempts:
// a run whose start task was received by a stopping worker, and waited
// there for a slot, runs its steps at attempt 1 on the next worker. (A
// worker pulls only what its slots can take, so a task waits only for a
// slot another consumer of the same worker holds: here a branch task of
// o-0 holds the only slot while the start task of o-1 waits.)
//
// A task that the server sent while the worker was unsubscribing can be
// lost in transit and redelivered at once: that delivery counts as an
// attempt, as a crash would (the engine cannot tell the two apart), so the
// steps allow two attempts and only the handed-back runs are checked.
func TestReleasedTasksKeepTheirAttempts(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	release := make(chan struct{})
	busy := make(chan struct{}, 8)
	wf := NewWorkflow("once", func(ctx *Context, in int) (int, error) {
		if _, err := Step(ctx, "prep", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(fmt.Sprintf("%s#%d", info.StepID, info.Attempt))
			return in, nil
		}); err != nil {
			return 0, err
		}
		// Two branches: a branch task holds the slot, not the run's task.
		only := Go(ctx, "only", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(fmt.Sprintf("%s#%d", info.StepID, info.Attempt))
			if in == 0 {
				busy <- struct{}{}
				<-release
			}
			return in, nil
		}, WithMaxAttempts(2))
		side := Go(ctx, "side", func(context.Context) (int, error) { return 0, nil })
		if err := AwaitAll(ctx, only, side); err != nil {
			return 0, err
		}
		return only.Get(ctx)
	})
	var (
		mu       sync.Mutex
		released = map[string]bool{}
	)
	w := startWorker(t, env.conn(), WorkerConfig{Concurrency: 1, Topology: env.topo, hooks: workflow.Hooks{
		AfterRelease: func(runID string) { mu.Lock(); released[runID] = true; mu.Unlock() },
	}}, wf)
	c := env.client()
	_, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("o-0"))
	require.NoError(t, err)
	<-busy
	var handles []*Handle[int]
	for i := 1; i <= 3; i++ {
		h, err := Start(ctxT(t, 5*time.Second), c, wf, i, WithRunID(fmt.Sprintf("o-%d", i)))
		require.NoError(t, err)
		handles = append(handles, h)
	}
	// o-1 is delivered and waits for o-0's slot; then the worker stops
	// before o-0 finishes, so o-1 is handed back, never started.
	cons, err := c.assets.JS.Consumer(ctxT(t, 5*time.Second), jetstream.TasksStream, jetstream.ConsumerName("once", jetstream.RunTasks))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumAckPending >= 1
	}, 10*time.Second, 5*time.Millisecond, "o-1 was not delivered while o-0 ran")
	var stopped atomic.Bool
	go func() {
		_ = w.Stop(ctxT(t, 10*time.Second))
		stopped.Store(true)
	}()
	require.Eventually(t, w.pool.Stopping, 10*time.Second, time.Millisecond)
	close(release)
	require.Eventually(t, stopped.Load, 10*time.Second, 10*time.Millisecond)
	mu.Lock()
	require.True(t, released["o-1"], "o-1 was handed back (released: %v)", released)
	mu.Unlock()

	env.worker(WorkerConfig{}, wf)
	for _, h := range handles {
		out, err := h.Result(ctxT(t, 20*time.Second))
		require.NoError(t, err, "run %s", h.RunID)
		require.Positive(t, out)
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range released {
		steps, err := c.Steps(ctxT(t, 5*time.Second), id)
		require.NoError(t, err)
		require.Len(t, steps, 3)
		for _, s := range steps {
			require.Equal(t, 1, s.Attempt, "run %s: a handed-back task must not count as an attempt", id)
		}
		require.Equal(t, 1, effects.get(id+".prep.0#1"))
		require.Equal(t, 1, effects.get(id+".only.0#1"))
	}
}

// Deferred Step calls (a saga's compensation) unwind with the body when it
// suspends; they do not leak goroutines (goleak checks after the package).
func TestDeferredStepsUnwind(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("saga", func(ctx *Context, _ int) (string, error) {
		defer func() { _, _ = Step(ctx, "undo-a", func(context.Context) (int, error) { return 0, nil }) }()
		defer func() { _, _ = Step(ctx, "undo-b", func(context.Context) (int, error) { return 0, nil }) }()
		for _, name := range []string{"a", "b", "c"} {
			if _, err := Step(ctx, name, func(context.Context) (int, error) { return 1, nil }); err != nil {
				return "", err
			}
		}
		return "ok", nil
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	for i := range 5 {
		h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID(fmt.Sprintf("saga-%d", i)))
		require.NoError(t, err)
		out, err := h.Result(ctxT(t, 20*time.Second))
		require.NoError(t, err)
		require.Equal(t, "ok", out)
		steps, err := c.Steps(ctxT(t, 5*time.Second), h.RunID)
		require.NoError(t, err)
		require.Len(t, steps, 5, "the deferred steps run once the body returns")
	}
}

// Output over the size limit fails the step (fatally, the side effect ran
// once) or the run, instead of looping.
func TestOversizedOutputsFailCleanly(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	big := strings.Repeat("x", 600*1024)
	stepBig := NewWorkflow("big-step", func(ctx *Context, _ int) (string, error) {
		return Step(ctx, "huge", func(context.Context) (string, error) {
			effects.inc("huge")
			return big, nil
		})
	})
	runBig := NewWorkflow("big-run", func(ctx *Context, _ int) (string, error) {
		return big, nil
	})
	env.worker(WorkerConfig{}, stepBig, runBig)
	c := env.client()

	h, err := Start(ctxT(t, 5*time.Second), c, stepBig, 0, WithRunID("big-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Contains(t, re.Message, "over the")
	require.Equal(t, 1, effects.get("huge"))

	h2, err := Start(ctxT(t, 5*time.Second), c, runBig, 0, WithRunID("big-2"))
	require.NoError(t, err)
	_, err = h2.Result(ctxT(t, 20*time.Second))
	require.ErrorAs(t, err, &re)
	require.Equal(t, "output", re.Kind)
}

// A run ID whose run has expired (retention) starts a new run, which runs
// its steps again: no worker answers them from the old run's history.
func TestRunIDReusedAfterRetentionRunsAgain(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{Retention: 2 * time.Second, DuplicateWindow: time.Second})
	effects := newCounter()
	wf := threeSteps("short-lived", effects)
	env.worker(WorkerConfig{}, wf)
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	for i := range 2 {
		id := fmt.Sprintf("r-%d", i)
		h, err := Start(ctxT(t, 5*time.Second), c, wf, 1, WithRunID(id))
		require.NoError(t, err)
		out, err := h.Result(ctxT(t, 20*time.Second))
		require.NoError(t, err)
		require.Equal(t, 4, out)
	}
	require.Eventually(t, func() bool {
		_, err0 := c.GetRun(context.Background(), "r-0")
		_, err1 := c.GetRun(context.Background(), "r-1")
		return errors.Is(err0, ErrRunNotFound) && errors.Is(err1, ErrRunNotFound)
	}, 20*time.Second, 100*time.Millisecond, "records never expired")
	for i := range 2 {
		id := fmt.Sprintf("r-%d", i)
		h, err := Start(ctxT(t, 5*time.Second), c, wf, 100, WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, h.Outcome, "the run expired, so this is a new run")
		out, err := h.Result(ctxT(t, 20*time.Second))
		require.NoError(t, err)
		require.Equal(t, 103, out, "the new run must run its own steps")
		steps, err := c.Steps(ctxT(t, 5*time.Second), id)
		require.NoError(t, err)
		require.Len(t, steps, 3)
		for _, s := range steps {
			require.Equal(t, 1, effects.get(s.StepID), "step %s of the new run", s.StepID)
		}
		require.Equal(t, 1, effects.get(id+".a.0"), "the old run's step ran once")
	}
}
