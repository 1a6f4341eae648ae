package jetflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRunCompletesWithTypedResult(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("sum", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	h, err := Start(ctxT(t, 10*time.Second), c, wf, 10, WithRunID("sum-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	require.Equal(t, "sum-1", h.RunID)

	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, 13, out)
	require.Equal(t, map[string]int{"sum-1.a.0": 1, "sum-1.b.0": 1, "sum-1.c.0": 1}, effects.snapshot())

	steps, err := c.Steps(ctxT(t, 5*time.Second), "sum-1")
	require.NoError(t, err)
	require.Len(t, steps, 3)
	for i, name := range []string{"a", "b", "c"} {
		require.Equal(t, name, steps[i].Name)
		require.Equal(t, i, steps[i].Seq)
		require.Equal(t, 1, steps[i].Attempt)
	}

	run, err := c.GetRun(ctxT(t, 5*time.Second), "sum-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `13`, string(run.Output))
}
