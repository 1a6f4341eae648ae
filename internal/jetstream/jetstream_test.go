package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
)

// embeddedConn starts an embedded server of the test's own and connects
// to it; both end with the test.
func embeddedConn(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := Connect(srv.ClientURL(), t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func setup(t *testing.T, topo Topology) *Assets {
	t.Helper()
	nc := embeddedConn(t)
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
	subj := RunSubject("wf", "run-1")

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

	cons, err := a.EnsureConsumer(ctx(t), "wf", RunTasks, ConsumerConfig{AckWait: time.Second, MaxAckPending: 10})
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
	nc := embeddedConn(t)

	_, err := Provision(ctx(t), nc, Topology{DuplicateWindow: 5 * time.Second}, CreateOrUpdate)
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
		err := ValidateTopology(TopologyWithDefaults(topo))
		require.Error(t, err, field)
		require.Contains(t, err.Error(), field)
	}
	require.NoError(t, ValidateTopology(TopologyWithDefaults(Topology{})))
}

func TestIsWrongLastSequenceOnlyMatchesCASConflicts(t *testing.T) {
	t.Parallel()
	require.True(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequence}))
	require.True(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamWrongLastSequenceConstant}))
	require.False(t, IsWrongLastSequence(&natsjs.APIError{ErrorCode: natsjs.JSErrCodeStreamNotFound}))
	require.False(t, IsWrongLastSequence(errors.New("wrong last sequence")))
}

// A write with TTLNever ("Nats-TTL: never", stored as -1) outlives both the
// per-message TTLs and the bucket's MaxAge, which expire the writes around
// it; the next write with a TTL expires as usual and leaves a marker that
// says when the key expired.
func TestKVTTLNeverOutlivesMaxAge(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{Retention: time.Second, DuplicateWindow: 100 * time.Millisecond})
	info, err := a.JS.Stream(ctx(t), "KV_"+RunsBucket)
	require.NoError(t, err)
	require.Equal(t, time.Second, info.CachedInfo().Config.MaxAge)

	began := time.Now()
	rev, err := a.Runs.CreateTTL(ctx(t), "kept", []byte("running"), TTLNever) // first: the age check passes over it
	require.NoError(t, err)
	_, err = a.Runs.CreateTTL(ctx(t), "ttl", []byte("x"), time.Second)
	require.NoError(t, err)
	_, err = a.Runs.Create(ctx(t), "max-age", []byte("x"))
	require.NoError(t, err)
	m, err := info.GetMsg(ctx(t), rev)
	require.NoError(t, err)
	require.Equal(t, "never", m.Header.Get(natsjs.MsgTTLHeader))

	// Both others expire, the TTLNever one stays through twice the MaxAge.
	deadline := began.Add(2*time.Second + 500*time.Millisecond)
	require.Eventually(t, func() bool {
		_, _, e1 := a.Runs.Get(context.Background(), "ttl")
		_, _, e2 := a.Runs.Get(context.Background(), "max-age")
		return errors.Is(e1, ErrNotFound) && errors.Is(e2, ErrNotFound) && time.Now().After(deadline)
	}, 20*time.Second, 50*time.Millisecond)
	v, got, err := a.Runs.Get(ctx(t), "kept")
	require.NoError(t, err, "a TTLNever write expired")
	require.Equal(t, rev, got)
	require.Equal(t, "running", string(v))

	// The next write's TTL applies again, and its marker has a time.
	rev2, err := a.Runs.UpdateTTL(ctx(t), "kept", []byte("ended"), rev, time.Second)
	require.NoError(t, err)
	wrote := time.Now()
	require.Eventually(t, func() bool {
		_, _, err := a.Runs.Get(context.Background(), "kept")
		return errors.Is(err, ErrNotFound)
	}, 20*time.Second, 50*time.Millisecond)
	st, err := a.Runs.Latest(ctx(t), "kept")
	require.NoError(t, err)
	require.False(t, st.Live)
	require.Greater(t, st.Rev, rev2)
	require.WithinDuration(t, wrote.Add(time.Second), st.Time, 2*time.Second)
	require.False(t, st.Time.Before(wrote), "the marker is stamped when the key expired")

	_, err = a.Runs.CreateTTL(ctx(t), "neg", []byte("x"), -2*time.Second)
	require.Error(t, err, "only TTLNever is a negative TTL")
}

// A worker's CreateOrUpdate provisioning updates only what differs: a second
// worker with the same topology sends no stream update (an update racing
// the consumer creations of the first worker is what a rolling deploy does
// at every start), and a changed setting is still applied, to the stream or
// bucket it concerns.
func TestCreateOrUpdateUpdatesOnlyWhatDiffers(t *testing.T) {
	t.Parallel()
	nc := embeddedConn(t)
	updates, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.STREAM.UPDATED.>")
	require.NoError(t, err)
	// updated returns the streams updated since its last call: at least
	// want of them, waited for (the server sends its advisories after it
	// answers the updates), then whatever else has arrived.
	updated := func(want ...int) []string {
		require.NoError(t, nc.FlushWithContext(ctx(t)))
		var streams []string
		deadline := time.Now().Add(10 * time.Second)
		for {
			wait := time.Duration(0)
			if len(want) > 0 && len(streams) < want[0] {
				wait = time.Until(deadline)
			}
			m, err := updates.NextMsg(wait)
			if err != nil {
				return streams
			}
			streams = append(streams, m.Subject[len("$JS.EVENT.ADVISORY.STREAM.UPDATED."):])
		}
	}

	_, err = Provision(ctx(t), nc, Topology{}, CreateOrUpdate)
	require.NoError(t, err)
	require.Empty(t, updated(), "creating sends no update")
	_, err = Provision(ctx(t), nc, Topology{}, CreateOrUpdate)
	require.NoError(t, err)
	require.Empty(t, updated(), "the same topology again sends no update")

	a, err := Provision(ctx(t), nc, Topology{DuplicateWindow: 7 * time.Second, Retention: 48 * time.Hour}, CreateOrUpdate)
	require.NoError(t, err)
	// The buckets of a run's records have no age limit: the retention
	// does not touch them.
	changed := []string{TasksStream, StartsStream, TimersStream, "KV_" + RunsBucket, "KV_" + AuditBucket}
	require.ElementsMatch(t, changed, updated(len(changed)))
	info, err := a.Tasks.Info(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, info.Config.Duplicates)
	st, err := a.Runs.Raw().Status(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 48*time.Hour, st.TTL())
}

// A worker of the version before the lease executor provisions the task
// and timer streams with its subjects only; RestoreSubjects adds this
// version's back, keeps the earlier ones, and then has nothing to add.
func TestRestoreSubjectsAfterAnEarlierVersionsProvisioning(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	for name, old := range map[string][]string{
		TasksStream:  {"jetflow.task.>"},
		TimersStream: {"jetflow.timer.>", "jetflow.due.>"},
	} {
		s, err := a.JS.Stream(ctx(t), name)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.Subjects = old
		_, err = a.JS.UpdateStream(ctx(t), cfg)
		require.NoError(t, err)
	}
	_, err := a.JS.Publish(ctx(t), RunSubject("w", "r"), nil)
	require.Error(t, err, "no stream takes this version's tasks any more")

	added, err := a.RestoreSubjects(ctx(t))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{TasksStream + " " + RunSubjects, TasksStream + " " + BranchSubjects,
		TimersStream + " " + timerSubjects, TimersStream + " " + fireSubjects}, added)
	_, err = a.JS.Publish(ctx(t), RunSubject("w", "r"), nil)
	require.NoError(t, err)
	s, err := a.JS.Stream(ctx(t), TasksStream)
	require.NoError(t, err)
	require.Contains(t, s.CachedInfo().Config.Subjects, "jetflow.task.>", "the earlier version's subjects stay")

	added, err = a.RestoreSubjects(ctx(t))
	require.NoError(t, err)
	require.Empty(t, added)
}
