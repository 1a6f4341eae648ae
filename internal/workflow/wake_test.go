package workflow

import (
	"context"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// wakeSetup provisions a server of the test's own and returns its assets
// and a running run of workflow "w" whose run subject holds one pending
// task, a wake, at stream sequence seq.
func wakeSetup(t *testing.T) (a *jetstream.Assets, run state.Run, seq uint64) {
	t.Helper()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	run = state.Run{V: state.Version, RunID: "r", Workflow: "w", Status: state.StatusRunning, Token: "tok", Exec: state.ExecLease}
	wake := state.StepTask(run, 1, "r.s.0")
	wake.Wake = true
	b, err := state.Encode(wake)
	require.NoError(t, err)
	ack, err := a.JS.Publish(ctx, jetstream.RunSubject("w", "r"), b)
	require.NoError(t, err)
	return a, run, ack.Sequence
}

// parkLease writes the run's lease parked by the holder of the task at seq.
func parkLease(t *testing.T, a *jetstream.Assets, seq uint64) {
	t.Helper()
	b, err := state.Encode(state.Lease{V: state.Version, State: state.LeaseParked, Seq: seq, Delivered: 1})
	require.NoError(t, err)
	_, err = a.Steps.Put(t.Context(), state.LeaseKey("r"), b)
	require.NoError(t, err)
}

// A wake refused because the parked holder's own task is still in the
// stream (acknowledged, its removal not applied yet: on a cluster the
// removal is replicated after the acknowledgement is confirmed) is
// published again until the task is gone: it must not be absorbed by a
// task nobody executes any more.
func TestWakeWaitsOutTheParkedHoldersLeftover(t *testing.T) {
	t.Parallel()
	a, run, seq := wakeSetup(t)
	parkLease(t, a, seq)

	done := make(chan jetstream.Dedup, 1)
	go func() {
		d, err := Wake(t.Context(), a, run, 1, "r.s.0", "r.s.0.wake")
		if err != nil {
			t.Error(err)
		}
		done <- d
	}()
	select {
	case d := <-done:
		t.Fatalf("the wake returned (%v) while the leftover was still in the stream", d)
	case <-time.After(50 * time.Millisecond): // a pause, not a synchronisation: Wake must still be trying
	}
	s, err := a.JS.Stream(t.Context(), jetstream.TasksStream)
	require.NoError(t, err)
	require.NoError(t, s.DeleteMsg(t.Context(), seq)) // the removal lands
	require.Equal(t, jetstream.Stored, <-done)
	m, err := s.GetLastMsgForSubject(t.Context(), jetstream.RunSubject("w", "r"))
	require.NoError(t, err)
	task, err := state.DecodeTask(m.Data)
	require.NoError(t, err)
	require.True(t, task.Wake)
	require.Equal(t, "r.s.0", task.StepID)
}

// Any other pending task absorbs the wake at once: a wake not delivered
// yet, or the task of a holder at work, sees the commit or parks and looks
// again.
func TestWakeIsAbsorbedByAnotherPendingTask(t *testing.T) {
	t.Parallel()
	a, run, seq := wakeSetup(t)
	for _, lease := range []func(){
		func() {},                         // no lease yet: a fresh holder at work
		func() { parkLease(t, a, seq-1) }, // parked by an earlier task; this one is a wake not taken yet
	} {
		lease()
		d, err := Wake(t.Context(), a, run, 1, "r.s.0", "r.s.0.wake")
		require.NoError(t, err)
		require.Equal(t, jetstream.PendingSubject, d)
	}
	s, err := a.JS.Stream(t.Context(), jetstream.TasksStream)
	require.NoError(t, err)
	info, err := s.Info(t.Context(), natsjs.WithSubjectFilter(jetstream.RunSubject("w", "r")))
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "the pending task alone")
}
