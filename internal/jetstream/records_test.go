package jetstream

import (
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// A deployment provisioned by the version before keeps its run records'
// buckets with the retention as their age limit; this version's
// provisioning takes the limit off in place (the records stay) and says
// so. A worker of the version before that starts later puts the limit
// back — its update is accepted, nothing on these buckets depends on a
// setting it cannot change — and RestoreBuckets takes it off again.
func TestRunRecordBucketsLoseTheirAgeLimitInPlace(t *testing.T) {
	t.Parallel()
	nc := embeddedConn(t)
	js, err := natsjs.New(nc)
	require.NoError(t, err)
	earlier := func(name string) natsjs.KeyValueConfig {
		return natsjs.KeyValueConfig{Bucket: name, Description: "as the version before made it", History: 1, TTL: time.Hour}
	}
	for _, name := range RunRecordBuckets {
		kv, err := js.CreateKeyValue(ctx(t), earlier(name))
		require.NoError(t, err)
		_, err = kv.Create(ctx(t), "run-1.a.0", []byte("kept"))
		require.NoError(t, err)
	}

	var changes changeLog
	a, err := Provision(ctx(t), nc, Topology{Retention: time.Hour}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	changed := map[string][]string{}
	for _, l := range changes.take() {
		changed[l.kv[1].(string)] = l.kv[3].([]string)
	}
	for _, name := range RunRecordBuckets {
		require.Contains(t, changed[name], "TTL: 1h0m0s → none", name)
		s, err := js.Stream(ctx(t), "KV_"+name)
		require.NoError(t, err)
		require.Zero(t, s.CachedInfo().Config.MaxAge, name)
		require.EqualValues(t, 1, s.CachedInfo().State.Msgs, "%s lost its records", name)
	}
	v, _, err := a.Steps.Get(ctx(t), "run-1.a.0")
	require.NoError(t, err)
	require.Equal(t, "kept", string(v))

	// A worker of the version before starts.
	for _, name := range RunRecordBuckets {
		_, err := js.UpdateKeyValue(ctx(t), earlier(name))
		require.NoError(t, err, "the version before cannot provision %s", name)
	}
	restored, err := a.RestoreBuckets(ctx(t))
	require.NoError(t, err)
	require.ElementsMatch(t, RunRecordBuckets, restored)
	for _, name := range RunRecordBuckets {
		s, err := js.Stream(ctx(t), "KV_"+name)
		require.NoError(t, err)
		require.Zero(t, s.CachedInfo().Config.MaxAge, name)
	}
	restored, err = a.RestoreBuckets(ctx(t))
	require.NoError(t, err)
	require.Empty(t, restored)
	_, err = Provision(ctx(t), nc, Topology{Retention: time.Hour}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	for _, l := range changes.take() {
		require.NotContains(t, l.kv[3], "TTL: 1h0m0s → none", "a restored bucket's age limit is changed again")
	}

	// Why these buckets carry no per-message TTL ("Nats-TTL: never",
	// which would need AllowMsgTTL): once a stream allows message TTLs,
	// the server refuses any update that does not, such as the version
	// before's provisioning of its bucket.
	_, err = js.CreateKeyValue(ctx(t), natsjs.KeyValueConfig{Bucket: "ttl_allowed", History: 1, TTL: time.Hour, LimitMarkerTTL: time.Second})
	require.NoError(t, err)
	_, err = js.UpdateKeyValue(ctx(t), natsjs.KeyValueConfig{Bucket: "ttl_allowed", History: 1, TTL: 2 * time.Hour})
	require.ErrorContains(t, err, "message TTL status can not be disabled")
}

// Purge removes the keys of one run generation (<identity>.>) and no
// other's — not a later generation's (<identity>/<n>.>), not a run ID
// that starts the same — and leaves no marker: a create-if-absent of a
// removed key succeeds. With a revision it removes a key only as written
// up to that revision.
func TestPurgeRemovesOneGenerationsKeys(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	for _, k := range []string{"r.a.0", "r.lease", "r.b.0", "r/7.a.0", "rx.a.0"} {
		_, err := a.Steps.Create(ctx(t), k, []byte(k))
		require.NoError(t, err)
	}
	n, err := a.Steps.Purge(ctx(t), "r.>", 0)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	left, err := a.Steps.Matching(ctx(t), ">")
	require.NoError(t, err)
	require.Equal(t, []Entry{{"r/7.a.0", []byte("r/7.a.0"), 4}, {"rx.a.0", []byte("rx.a.0"), 5}}, left)
	_, err = a.Steps.Create(ctx(t), "r.a.0", []byte("again"))
	require.NoError(t, err, "a purge leaves a marker")
	n, err = a.Steps.Purge(ctx(t), "nothing.>", 0)
	require.NoError(t, err)
	require.Zero(t, n)

	rev, err := a.Hooks.Create(ctx(t), "tok", []byte("first"))
	require.NoError(t, err)
	rev2, err := a.Hooks.Update(ctx(t), "tok", []byte("taken over"), rev)
	require.NoError(t, err)
	n, err = a.Hooks.Purge(ctx(t), "tok", rev)
	require.NoError(t, err)
	require.Zero(t, n, "the key was written again after the revision")
	v, _, err := a.Hooks.Get(ctx(t), "tok")
	require.NoError(t, err)
	require.Equal(t, "taken over", string(v))
	n, err = a.Hooks.Purge(ctx(t), "tok", rev2)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, _, err = a.Hooks.Get(ctx(t), "tok")
	require.ErrorIs(t, err, ErrNotFound)
}

// An expiry stored with a due time in the past fires at once, one due
// later not before its (whole) second; both keep their body and due time.
// An expiry is not a run's timer: no run's timer filters match it, and the
// consumer of due timers, which a worker of the version before shares,
// does not take it.
func TestScheduleExpiryFiresWhenDue(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	cons, err := a.EnsureExpiryConsumer(ctx(t), ConsumerConfig{AckWait: time.Second})
	require.NoError(t, err)

	past := time.Now().Add(-time.Hour)
	require.NoError(t, ScheduleExpiry(ctx(t), a.JS, "a", []byte("past"), past))
	later := time.Now().Add(1500 * time.Millisecond)
	require.NoError(t, ScheduleExpiry(ctx(t), a.JS, "b", []byte("later"), later))
	has, err := HasMessages(ctx(t), a.Timers, RunTimersFilters("*", "*")...)
	require.NoError(t, err)
	require.False(t, has, "an expiry matches a run's timer filters")

	due, err := a.EnsureDueConsumer(ctx(t), ConsumerConfig{AckWait: time.Second})
	require.NoError(t, err)
	defer func() {
		info, err := due.Info(ctx(t))
		require.NoError(t, err)
		require.Zero(t, info.NumPending+uint64(info.NumAckPending), "the consumer of due timers got an expiry")
	}()
	for _, want := range []struct {
		body string
		due  time.Time
	}{{"past", past}, {"later", later}} {
		msgs, err := cons.Fetch(1, natsjs.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		var got []natsjs.Msg
		for m := range msgs.Messages() {
			got = append(got, m)
		}
		require.Len(t, got, 1, "%s never fired", want.body)
		m := got[0]
		require.True(t, IsExpiry(m.Subject()), m.Subject())
		require.Equal(t, want.body, string(m.Data()))
		due, err := time.Parse(time.RFC3339Nano, m.Headers().Get(DueHeader))
		require.NoError(t, err)
		require.True(t, want.due.Equal(due))
		require.False(t, time.Now().Before(want.due), "%s fired before it was due", want.body)
		require.NoError(t, m.Ack())
	}
}
