package roster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// ttl is the liveness TTL of these tests: short, yet twice the minimum, so
// that a heartbeat (every third of it) delayed by a busy machine does not
// let a record lapse. Every wait below is a multiple of it.
const ttl = 2 * MinTTL

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// bucket provisions the engine's resources on a server of the test's own
// and returns the workflows bucket, bound on a connection of its own.
func bucket(t *testing.T, srv *natsserver.Server) *jetstream.KV {
	t.Helper()
	a, err := jetstream.Provision(ctxT(t, 10*time.Second), testenv.Conn(t, srv), jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	return a.Workflows
}

func TestKnownRecordNamesTheFirstWorkerOnly(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	ctx := ctxT(t, 10*time.Second)

	_, found, err := Lookup(ctx, kv, "order")
	require.NoError(t, err)
	require.False(t, found, "never served: unknown")

	first, err := Announce(ctx, kv, []string{"order", "refund"}, "w-1", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	second, err := Announce(ctx, kv, []string{"order"}, "w-2", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err, "a second worker finds the workflow known")
	require.NoError(t, second.Stop(ctx))
	require.NoError(t, first.Stop(ctx))

	for _, wf := range []string{"order", "refund"} {
		k, found, err := Lookup(ctx, kv, wf)
		require.NoError(t, err)
		require.True(t, found, "%s stays known after its workers stopped", wf)
		require.Equal(t, wf, k.Workflow)
		require.Equal(t, "w-1", k.FirstWorker, "the first worker's record is never overwritten")
		require.False(t, k.FirstServed.IsZero())
	}
	_, found, err = Lookup(ctx, kv, "ordr")
	require.NoError(t, err)
	require.False(t, found)
}

// watchLive follows the liveness record key from its current value on:
// puts and the marker of its expiry or withdrawal.
func watchLive(t *testing.T, kv *jetstream.KV, key string) natsjs.KeyWatcher {
	t.Helper()
	w, err := kv.Raw().Watch(ctxT(t, time.Minute), key)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, w.Stop()) })
	return w
}

// next is the watcher's next entry, skipping the initial-values marker
// (nil); it fails t when nothing comes by the deadline.
func next(t *testing.T, w natsjs.KeyWatcher, deadline <-chan time.Time) natsjs.KeyValueEntry {
	t.Helper()
	for {
		select {
		case e := <-w.Updates():
			if e != nil {
				return e
			}
		case <-deadline:
			t.Fatal("no liveness update before the deadline")
		}
	}
}

// followHeartbeats follows worker's liveness record until its heartbeats
// span 3 TTLs: without a heartbeat it would have expired twice over. A
// marker on the way, or no progress within 30 TTLs, fails t.
func followHeartbeats(t *testing.T, w natsjs.KeyWatcher, worker string) {
	t.Helper()
	deadline := time.After(30 * ttl)
	var first time.Time
	for {
		e := next(t, w, deadline)
		require.Equal(t, natsjs.KeyValuePut, e.Operation(), "the record expired while its worker ran")
		var l Live
		require.NoError(t, json.Unmarshal(e.Value(), &l))
		require.Equal(t, worker, l.Worker)
		if first.IsZero() {
			first = l.Beat
		}
		if l.Beat.Sub(first) >= 3*ttl {
			return
		}
	}
}

func TestHeartbeatKeepsLivenessWhileRunning(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	p, err := Announce(ctxT(t, 10*time.Second), kv, []string{"order"}, "w-1", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	w := watchLive(t, kv, LiveKey("order", p.id))

	followHeartbeats(t, w, "w-1")
	require.NoError(t, p.Stop(ctxT(t, 10*time.Second)))
	e := next(t, w, time.After(10*ttl))
	require.NotEqual(t, natsjs.KeyValuePut, e.Operation(), "Stop withdraws the record at once")
}

func TestLivenessExpiresWhenTheWorkerDies(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	kv := bucket(t, srv)
	// The dying worker has a connection of its own; closing it is, for
	// NATS, what a SIGKILL is: no Stop, no further heartbeat.
	workerNC := testenv.Conn(t, srv)
	a, err := jetstream.Provision(ctxT(t, 10*time.Second), workerNC, jetstream.Topology{}, jetstream.Ensure)
	require.NoError(t, err)
	p, err := Announce(ctxT(t, 10*time.Second), a.Workflows, []string{"order"}, "w-doomed", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	w := watchLive(t, kv, LiveKey("order", p.id))
	require.Equal(t, natsjs.KeyValuePut, next(t, w, time.After(10*ttl)).Operation())

	workerNC.Close()
	// The server expires a message within a second or so of its TTL; a
	// record that outlives 10 TTLs after the last heartbeat is a bug.
	deadline := time.After(10 * ttl)
	for {
		e := next(t, w, deadline)
		if e.Operation() != natsjs.KeyValuePut {
			break // the expiry marker
		}
	}
	st, err := kv.Latest(ctxT(t, 10*time.Second), LiveKey("order", p.id))
	require.NoError(t, err)
	require.False(t, st.Live, "gone after its TTL")
	_, found, err := Lookup(ctxT(t, 10*time.Second), kv, "order")
	require.NoError(t, err)
	require.True(t, found, "the workflow stays known")

	require.Error(t, p.Stop(ctxT(t, 10*time.Second)), "nothing to withdraw over a closed connection, and Stop says so")
}

func TestAnnounceRefusesATTLUnderASecond(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	_, err := Announce(ctxT(t, 10*time.Second), kv, []string{"order"}, "w-1", "b1", 500*time.Millisecond, testenv.Logger(t))
	require.ErrorContains(t, err, "at least 1s")
	_, found, err := Lookup(ctxT(t, 10*time.Second), kv, "order")
	require.NoError(t, err)
	require.False(t, found, "a refused announcement records nothing")
}

// On a replicated bucket the records are written and read as on one
// server: known once, a liveness record refreshed by compare-and-set
// against the stream leader's revision, withdrawn at Stop.
func TestRosterOnAThreeNodeCluster(t *testing.T) {
	t.Parallel()
	c := testenv.NewCluster(t)
	ctx := ctxT(t, 60*time.Second)
	a, err := jetstream.Provision(ctx, c.Conn(t, -1), jetstream.Topology{Replicas: 3}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	kv := a.Workflows
	p, err := Announce(ctx, kv, []string{"order"}, "w-r3", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	k, found, err := Lookup(ctx, kv, "order")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "w-r3", k.FirstWorker)

	followHeartbeats(t, watchLive(t, kv, LiveKey("order", p.id)), "w-r3")
	require.NoError(t, p.Stop(ctx))
	st, err := kv.Latest(ctx, LiveKey("order", p.id))
	require.NoError(t, err)
	require.False(t, st.Live, "withdrawn")
}
