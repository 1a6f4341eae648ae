package jetflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// G6: a worker killed between a step's commit and its ack. The broker
// redelivers the task to another worker, which finds the step committed and
// does not run it again; the run completes.
func TestWorkerKilledBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects, effectsURL := newEffectServer(t)
	c := env.client()

	first := startChild(t, env, "after-commit", effectsURL)
	h, err := Start(ctxT(t, 10*time.Second), c, crashWorkflow(effectsURL, nil), 0, WithRunID("crash-1"))
	require.NoError(t, err)
	waitKilled(t, first, 30*time.Second)

	// The step was committed before the crash...
	steps, err := c.Steps(ctxT(t, 5*time.Second), "crash-1")
	require.NoError(t, err)
	require.Len(t, steps, 2, "a and b committed before the kill")
	require.Equal(t, "crash-1.b.0", steps[1].StepID)

	// ...and a new worker finishes the run without running b again.
	startChild(t, env, "", effectsURL)
	out, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 3, out)
	require.Equal(t, []int{1}, effects.get("crash-1.a.0"))
	require.Equal(t, []int{1}, effects.get("crash-1.b.0"), "committed step ran again")
	// c ran once. The worker that took the run over cannot tell a worker
	// that died between b's commit and c's start from one that died in
	// c, so it counts c's run as the next attempt, as after a crash in c.
	require.Len(t, effects.get("crash-1.c.0"), 1)
}

// G6: a worker killed in the middle of a step. The step was not committed, so
// it runs again, with the same step ID and the next attempt number, and the
// run completes.
func TestWorkerKilledMidStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects, effectsURL := newEffectServer(t)
	c := env.client()

	first := startChild(t, env, "mid-step", effectsURL)
	h, err := Start(ctxT(t, 10*time.Second), c, crashWorkflow(effectsURL, nil), 0, WithRunID("crash-1"))
	require.NoError(t, err)
	waitKilled(t, first, 30*time.Second)
	steps, err := c.Steps(ctxT(t, 5*time.Second), "crash-1")
	require.NoError(t, err)
	require.Len(t, steps, 1, "only a is committed")

	startChild(t, env, "", effectsURL)
	out, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 3, out)
	require.Equal(t, []int{1}, effects.get("crash-1.a.0"))
	require.Equal(t, []int{1, 2}, effects.get("crash-1.b.0"), "b re-runs once, same step ID, next attempt")
	require.Equal(t, []int{1}, effects.get("crash-1.c.0"))

	steps, err = c.Steps(ctxT(t, 5*time.Second), "crash-1")
	require.NoError(t, err)
	require.Len(t, steps, 3)
	require.Equal(t, 2, steps[1].Attempt)
}
