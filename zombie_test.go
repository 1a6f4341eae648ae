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

// A redelivery that finds the step not yet committed, while the attempt
// before it still runs on a stalled worker that commits just after: the
// redelivered attempt reads the step's record again right before its
// function would run, takes the commit as the step's result, and the
// function runs once in all.
func TestRedeliveryTakesACommitMadeAfterItsLookup(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ctx := ctxT(t, 20*time.Second)
	var (
		mu    sync.Mutex
		calls []int // the attempts whose function ran
	)
	release, committed := make(chan struct{}), make(chan struct{})
	var releaseOnce, commitOnce sync.Once
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
			if stepID == "lc-1.charge.0" && won {
				commitOnce.Do(func() { close(committed) })
			}
		},
		BeforeAttempt: func(stepID string, attempt int) {
			if stepID != "lc-1.charge.0" || attempt < 2 {
				return
			}
			// The redelivery has looked the step up and found nothing:
			// now the stalled attempt commits. Later redeliveries (this
			// one is not heartbeated either) wait for the same commit.
			releaseOnce.Do(func() { close(release) })
			select {
			case <-committed:
			case <-ctx.Done():
				t.Errorf("attempt %d: the stalled attempt never committed", attempt)
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
	require.Equal(t, "charge-from-attempt-1", out)
	mu.Lock()
	require.Equal(t, []int{1}, calls, "only the stalled attempt ran the step function")
	mu.Unlock()
	steps, err := c.Steps(ctx, "lc-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, 1, steps[0].Attempt)
}
