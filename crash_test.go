package jetflow

import (
	"context"
	"encoding/json"
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

// G8, G25: a worker that admits a start (ClientConfig.StartByRequest) is
// SIGKILLed once it created the run's record, before it published the
// run's start task. The run is running with no task; another worker's
// sweeper finds it (StuckAfter after its creation) and wakes it, and the
// run completes with each step run once. The start's caller got no
// answer; its retry is answered existing.
func TestAdmitterKilledBetweenRecordAndStartTask(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects, effectsURL := newEffectServer(t)
	ctx := ctxT(t, 60*time.Second)
	pc := admitterKilledAfterCreate(t, env, effectsURL)
	run, err := pc.GetRun(ctx, "crash-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)
	info, err := pc.assets.Tasks.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "the killed admission published a start task")

	// StuckAfter is the least allowed (3 × AckWait).
	env.worker(WorkerConfig{AckWait: childAckWait, SweepInterval: 20 * time.Millisecond, StuckAfter: 3 * childAckWait},
		crashWorkflow(effectsURL, nil))
	out, err := pc.WaitRun(ctx, "crash-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, out.Status)
	for _, step := range []string{"crash-1.a.0", "crash-1.b.0", "crash-1.c.0"} {
		require.Len(t, effects.get(step), 1, "step %s ran %v", step, effects.get(step))
	}
	again, err := Start(ctx, env.client(), crashWorkflow(effectsURL, nil), 0, WithRunID("crash-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, again.Outcome)
}

// admitterKilledAfterCreate starts a worker process that admits starts
// by request and is SIGKILLed once it created a run's record (its
// after-create crash point), sends it the start of crash-1 (workflow
// crashy) and waits for its death. It returns the producer's client.
func admitterKilledAfterCreate(t *testing.T, env *testEnv, effectsURL string) *Client {
	t.Helper()
	child := startChild(t, env, "after-create", effectsURL)
	require.NoError(t, waitReady(child, 30*time.Second))
	ctx := ctxT(t, 30*time.Second)
	pc, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 2*childAckWait)
	defer cancel()
	_, err = pc.StartByName(sctx, "crashy", json.RawMessage(`0`), WithRunID("crash-1"))
	require.Error(t, err, "the admitting worker died before it answered")
	waitKilled(t, child, 30*time.Second)
	return pc
}
