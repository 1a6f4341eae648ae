package jetflow

import (
	"encoding/json"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// Runs of the executor before the lease are taken over by a worker of this
// version through that executor's own consumers: a run with a committed
// step and the task of its next step goes on from there (the committed
// step is not run again), and a start task whose record was never written
// starts its run. The records get exec, and the consumers are left empty.
// (TestUpgradeFromThePreviousEngine in internal/testsupport/opcluster does
// the same with that version's own binaries.)
func TestLegacyRunsTakenOver(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ctx := ctxT(t, time.Minute)
	assets, err := jetstream.Provision(ctx, env.conn(), env.topo, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	// The earlier executor's consumers, as it made them.
	filters := []string{"jetflow.task.old.*", "jetflow.task.old.*.>"} // start tasks, step tasks
	for i, name := range jetstream.LegacyConsumerNames("old") {
		_, err := assets.JS.CreateConsumer(ctx, jetstream.TasksStream, natsjs.ConsumerConfig{
			Durable: name, FilterSubject: filters[i], AckPolicy: natsjs.AckExplicitPolicy, AckWait: 5 * time.Second,
		})
		require.NoError(t, err)
	}
	_, err = assets.JS.CreateConsumer(ctx, jetstream.TimersStream, natsjs.ConsumerConfig{
		Durable: jetstream.LegacyDueConsumer, FilterSubject: "jetflow.due.>", AckPolicy: natsjs.AckExplicitPolicy,
	})
	require.NoError(t, err)

	// legacy-1: step a committed, the task of step b pending (on the step
	// consumer's subjects). legacy-2: its start task only.
	now := time.Now().UTC()
	run := state.Run{V: state.Version, RunID: "legacy-1", Workflow: "old", Input: json.RawMessage(`1`),
		Status: state.StatusRunning, Token: "t1", CreatedAt: now, UpdatedAt: now}
	_, err = runs.New(assets).Create(ctx, run)
	require.NoError(t, err)
	a, err := state.Encode(state.Step{V: state.Version, StepID: "legacy-1.a.0", RunID: "legacy-1", Name: "a", Seq: 0,
		Attempt: 1, Output: json.RawMessage(`2`), Worker: "old-worker"})
	require.NoError(t, err)
	_, err = assets.Steps.Create(ctx, "legacy-1.a.0", a)
	require.NoError(t, err)
	// Under the message IDs that executor gave them: a step task its step
	// ID, a start task its run ID (this executor's start task's).
	publish := func(subject string, task state.Task) {
		b, err := state.Encode(task)
		require.NoError(t, err)
		id := task.StepID
		if id == "" {
			id = task.RunID
		}
		_, err = assets.JS.Publish(ctx, subject, b, natsjs.WithMsgID(id))
		require.NoError(t, err)
	}
	publish("jetflow.task.old.legacy-1.b.0", state.Task{V: state.Version, RunID: "legacy-1", Workflow: "old",
		StepID: "legacy-1.b.0", Input: json.RawMessage(`1`), Token: "t1"})
	publish("jetflow.task.old.legacy-2", state.Task{V: state.Version, RunID: "legacy-2", Workflow: "old",
		Input: json.RawMessage(`10`), Token: "t2", CreatedAt: now})

	effects := newCounter()
	env.worker(WorkerConfig{}, threeSteps("old", effects))
	c := env.client()
	for id, want := range map[string]string{"legacy-1": "4", "legacy-2": "13"} {
		// legacy-2's record is written once its start task is taken over.
		require.Eventually(t, func() bool {
			_, err := c.GetRun(ctx, id)
			return err == nil
		}, 10*time.Second, 10*time.Millisecond, "%s has a record", id)
		r, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, r.Status, "%s: %+v", id, r.Error)
		require.JSONEq(t, want, string(r.Output), id)
		stored, _, err := runs.New(assets).Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, state.ExecLease, stored.Exec, "%s is a run of this executor now", id)
		require.Equal(t, id == "legacy-1", stored.Adopted, "%s: taken over (legacy-2 was started from its task)", id)
	}
	require.Equal(t, map[string]int{"legacy-1.b.0": 1, "legacy-1.c.0": 1, "legacy-2.a.0": 1, "legacy-2.b.0": 1, "legacy-2.c.0": 1},
		effects.snapshot(), "the committed step ran not again, every other step once")
	for _, name := range jetstream.LegacyConsumerNames("old") {
		cons, err := assets.JS.Consumer(ctx, jetstream.TasksStream, name)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, 10*time.Second, 10*time.Millisecond, "%s left empty", name)
	}
}
