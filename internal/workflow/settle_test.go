package workflow

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// A dispatch of several steps publishes one task per step ID, each with its
// step ID as its message ID, so that a repeat is absorbed task by task.
func TestDispatchPublishesOneTaskPerStepID(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := testenv.Conn(t, testenv.Server(t))
	assets, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	e := NewExecutor(Config{Assets: assets, Logger: testenv.Logger(t)})

	run := state.Run{V: state.Version, RunID: "r1", Workflow: "wf", Token: "tok", Status: state.StatusRunning}
	d := &delivery{ctx: ctx, nctx: ctx, run: run, rev: 7}
	ids := []string{state.StepID("r1", "a", 0), state.StepID("r1", "b", 0)}

	failed, err := e.dispatch(ctx, d, ids, true)
	require.NoError(t, err)
	require.Empty(t, failed)
	for _, id := range ids {
		m, err := assets.Tasks.GetLastMsgForSubject(ctx, jetstream.TaskSubject("wf", "r1", id))
		require.NoError(t, err)
		require.Equal(t, id, m.Header.Get(nats.MsgIdHdr))
		task, err := state.DecodeTask(m.Data)
		require.NoError(t, err)
		require.Equal(t, id, task.StepID)
		require.Equal(t, uint64(7), task.Rev)
		require.False(t, task.Redispatched, "a task that ran its step hands over")
	}

	// A repeat (a redelivered task finding the same frontier) adds nothing.
	_, err = e.dispatch(ctx, d, ids, false)
	require.NoError(t, err)
	info, err := assets.Tasks.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(len(ids)), info.State.Msgs)
}
