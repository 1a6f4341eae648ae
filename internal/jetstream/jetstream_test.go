package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func setup(t *testing.T, topo Topology) *Assets {
	t.Helper()
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect(t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := Provision(ctx, nc, topo, CreateOrUpdate)
	require.NoError(t, err)
	return a
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// The compare-and-set helpers map JetStream's wrong-last-sequence answer to
// ErrExists and ErrRevisionMismatch, and never overwrite.
func TestKVCreateAndUpdateAreCompareAndSet(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	rev, err := a.Runs.Create(ctx(t), "k", []byte("first"))
	require.NoError(t, err)

	_, err = a.Runs.Create(ctx(t), "k", []byte("second"))
	require.ErrorIs(t, err, ErrExists)

	_, err = a.Runs.Update(ctx(t), "k", []byte("stale"), rev+100)
	require.ErrorIs(t, err, ErrRevisionMismatch)

	v, got, err := a.Runs.Get(ctx(t), "k")
	require.NoError(t, err)
	require.Equal(t, rev, got)
	require.Equal(t, "first", string(v))

	rev2, err := a.Runs.Update(ctx(t), "k", []byte("next"), rev)
	require.NoError(t, err)
	require.Greater(t, rev2, rev)

	_, _, err = a.Runs.Get(ctx(t), "missing")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = a.Runs.Update(ctx(t), "k", []byte("x"), 0)
	require.Error(t, err, "revision 0 is refused, not treated as a create")
}

// Two lines of task dedup: the message-ID window, and at most one pending
// task per subject, which outlives the window; once the task is acked the
// subject is free again.
func TestPublishTaskDedupLayers(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{DuplicateWindow: 200 * time.Millisecond})
	subj := TaskSubject("wf", "run-1", "")

	d, err := PublishTask(ctx(t), a.JS, subj, "run-1", []byte("one"))
	require.NoError(t, err)
	require.Equal(t, Stored, d)
	d, err = PublishTask(ctx(t), a.JS, subj, "run-1", []byte("two"))
	require.NoError(t, err)
	require.Equal(t, DuplicateMsgID, d)

	// After the window, the pending task still refuses a second one.
	require.Eventually(t, func() bool {
		d, err := PublishTask(context.Background(), a.JS, subj, "run-1", []byte("three"))
		return err == nil && d == PendingSubject
	}, 10*time.Second, 50*time.Millisecond)

	cons, err := a.EnsureConsumer(ctx(t), "wf", StartTasks, ConsumerConfig{AckWait: time.Second, MaxAckPending: 10})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, natsjs.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
		require.NoError(t, m.DoubleAck(ctx(t)))
	}
	require.NoError(t, batch.Error())
	require.Equal(t, []string{"one"}, got)

	// Acked and out of the window: a new task is stored.
	d, err = PublishTask(ctx(t), a.JS, subj, "run-1", []byte("four"))
	require.NoError(t, err)
	require.Equal(t, Stored, d)
}

// Ensure mode binds to existing resources without changing them.
func TestEnsureDoesNotRewriteExistingResources(t *testing.T) {
	t.Parallel()
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect(t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	_, err = Provision(ctx(t), nc, Topology{DuplicateWindow: 5 * time.Second}, CreateOrUpdate)
	require.NoError(t, err)
	a, err := Provision(ctx(t), nc, Topology{}, Ensure)
	require.NoError(t, err)
	info, err := a.Tasks.Info(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, info.Config.Duplicates)

	_, err = Provision(ctx(t), nc, Topology{Replicas: 9}, Ensure)
	require.Error(t, err, "an invalid topology is refused before touching NATS")
}

func TestTopologyValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for field, topo := range map[string]Topology{
		"Replicas":        {Replicas: 7},
		"DuplicateWindow": {DuplicateWindow: time.Millisecond},
		"Retention":       {Retention: time.Millisecond},
	} {
		err := topo.WithDefaults().Validate()
		require.Error(t, err, field)
		require.Contains(t, err.Error(), field)
	}
	require.NoError(t, Topology{}.WithDefaults().Validate())
}

func TestIsWrongLastSequenceOnlyMatchesCASConflicts(t *testing.T) {
	t.Parallel()
	require.True(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequence}))
	require.True(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequenceConstant}))
	require.False(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamNotFound}))
	require.False(t, IsWrongLastSequence(errors.New("wrong last sequence")))
}
