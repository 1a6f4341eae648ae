package jetflow

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fanOut starts n steps called "branch" in parallel, awaits them all and
// returns the sum of their results; every branch records its side effect
// under its step ID.
func fanOut(name string, effects *counter) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, n int) (int, error) {
		fs := make([]*Future[int], n)
		for i := range n {
			fs[i] = Go(ctx, "branch", func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				effects.inc(info.StepID)
				return i, nil
			})
		}
		aw := make([]Awaitable, n)
		for i, f := range fs {
			aw[i] = f
		}
		if err := AwaitAll(ctx, aw...); err != nil {
			return 0, err
		}
		sum := 0
		for _, f := range fs {
			v, err := f.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
}

func TestParallelStepsSmoke(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := fanOut("fan", effects)
	env.worker(WorkerConfig{Concurrency: 8}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 10, WithRunID("fan-1"))
	require.NoError(t, err)
	got, err := h.Result(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 45, got)
	snap := effects.snapshot()
	require.Len(t, snap, 10)
	for i := range 10 {
		require.Equal(t, 1, snap[fmt.Sprintf("fan-1.branch.%d", i)])
	}
}
