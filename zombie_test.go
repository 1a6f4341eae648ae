package jetflow

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/workflow"
)

// G6: a zombie worker. Its step runs past the ack deadline without extending
// it (as a paused or partitioned process would), so the broker redelivers the
// task and another attempt commits first. The zombie's late result must not
// overwrite the committed one, and the run goes on from the committed result
// with every later step run once.
func TestZombieWorkerCannotOverwriteCommittedResult(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	release := make(chan struct{})
	zombieStarted := make(chan struct{})
	lateCommit := make(chan bool, 4)

	wf := NewWorkflow("zombie", func(ctx *Context, _ int) (string, error) {
		v, err := Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(fmt.Sprintf("%s#%d", info.StepID, info.Attempt))
			if info.Attempt == 1 {
				close(zombieStarted)
				<-release // outlives its ack deadline
			}
			return fmt.Sprintf("charge-from-attempt-%d", info.Attempt), nil
		})
		if err != nil {
			return "", err
		}
		return Step(ctx, "receipt", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return "receipt for " + v, nil
		})
	})
	hooks := workflow.Hooks{
		NoHeartbeat: true,
		AfterCommit: func(stepID string, won bool) {
			if stepID == "z-1.charge.0" {
				lateCommit <- won
			}
		},
	}
	// Two workers share the consumer; either may become the zombie.
	env.worker(WorkerConfig{AckWait: 300 * time.Millisecond, hooks: hooks}, wf)
	env.worker(WorkerConfig{AckWait: 300 * time.Millisecond, hooks: hooks}, wf)
	c := env.client()

	h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("z-1"))
	require.NoError(t, err)
	<-zombieStarted
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "receipt for charge-from-attempt-2", out)
	require.True(t, <-lateCommit, "the redelivered attempt commits")

	close(release) // the zombie wakes up and tries to commit
	require.False(t, <-lateCommit, "the zombie's commit must lose")

	steps, err := c.Steps(ctxT(t, 5*time.Second), "z-1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.JSONEq(t, `"charge-from-attempt-2"`, string(steps[0].Output))
	require.Equal(t, 2, steps[0].Attempt)
	waitTasksDrained(t, c)
	require.Equal(t, 1, effects.get("z-1.receipt.0"), "the zombie's replay must not run later steps again")
	run, err := c.GetRun(ctxT(t, 5*time.Second), "z-1")
	require.NoError(t, err)
	require.JSONEq(t, `"receipt for charge-from-attempt-2"`, string(run.Output))
}

// A redelivery that takes a run over from a stalled holder, whose attempt
// at the step is still running and commits just after the redelivery began
// its own: the stalled attempt's commit is refused (its lease was taken
// over) and the redelivered attempt's result is the step's. The function
// ran once per holder, never twice for one.
//
// (Before the lease executor, the stalled attempt's late commit won and
// the redelivered attempt took it as its result.)
func TestStalledHoldersLateCommitIsRefused(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ctx := ctxT(t, 20*time.Second)
	var (
		mu    sync.Mutex
		calls []int // the attempts whose function ran
	)
	release, refused := make(chan struct{}), make(chan struct{})
	var releaseOnce, refuseOnce sync.Once
	wf := NewWorkflow("latecommit", func(ctx *Context, _ int) (string, error) {
		return Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			mu.Lock()
			calls = append(calls, info.Attempt)
			mu.Unlock()
			if info.Attempt == 1 {
				<-release // the stalled worker: no heartbeat, past its ack deadline
			}
			return fmt.Sprintf("charge-from-attempt-%d", info.Attempt), nil
		})
	})
	hooks := workflow.Hooks{
		NoHeartbeat: true,
		AfterCommit: func(stepID string, won bool) {
			if stepID == "lc-1.charge.0" && !won {
				refuseOnce.Do(func() { close(refused) })
			}
		},
		BeforeAttempt: func(stepID string, attempt int) {
			if stepID != "lc-1.charge.0" || attempt < 2 {
				return
			}
			// The redelivery holds the run: now the stalled attempt
			// tries to commit, and is refused.
			releaseOnce.Do(func() { close(release) })
			select {
			case <-refused:
			case <-ctx.Done():
				t.Errorf("attempt %d: the stalled attempt's commit was never refused", attempt)
			}
		},
	}
	env.worker(WorkerConfig{AckWait: 300 * time.Millisecond, hooks: hooks}, wf)
	env.worker(WorkerConfig{AckWait: 300 * time.Millisecond, hooks: hooks}, wf)
	c := env.client()

	h, err := Start(ctx, c, wf, 0, WithRunID("lc-1"))
	require.NoError(t, err)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	steps, err := c.Steps(ctx, "lc-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Greater(t, steps[0].Attempt, 1, "the stalled attempt's commit stood")
	require.Equal(t, fmt.Sprintf("charge-from-attempt-%d", steps[0].Attempt), out)
	mu.Lock()
	require.Equal(t, 1, countOf(calls, steps[0].Attempt), "an attempt's function ran twice")
	mu.Unlock()
}

// countOf counts v in xs.
func countOf(xs []int, v int) int {
	n := 0
	for _, x := range xs {
		if x == v {
			n++
		}
	}
	return n
}
