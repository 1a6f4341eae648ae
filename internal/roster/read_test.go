package roster

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// Read tells the three answers to a start nobody answered apart: no
// worker of the deployment live (any name: retry later), a known
// workflow, and a name never served while a worker is live. A withdrawn
// worker's marker is no live worker.
func TestReadTellsNoWorkerYetFromUnknown(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	ctx := ctxT(t, 10*time.Second)

	s, err := Read(ctx, kv, "order", time.Now())
	require.NoError(t, err)
	require.Equal(t, Status{}, s, "a fresh deployment: nothing known, no worker live")

	p, err := Announce(ctx, kv, []string{"order", "refund"}, "w-1", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	s, err = Read(ctx, kv, "ordr", time.Now())
	require.NoError(t, err)
	require.False(t, s.Found)
	require.Equal(t, 2, s.Live, "w-1's two liveness records")
	s, err = Read(ctx, kv, "order", time.Now())
	require.NoError(t, err)
	require.True(t, s.Found)
	require.Equal(t, "w-1", s.Known.FirstWorker)

	require.NoError(t, p.Stop(ctx))
	s, err = Read(ctx, kv, "ordr", time.Now())
	require.NoError(t, err)
	require.Equal(t, Status{}, s, "withdrawn: no worker live")
	s, err = Read(ctx, kv, "refund", time.Now())
	require.NoError(t, err)
	require.True(t, s.Found, "known for good")
	require.Zero(t, s.Live)
}

// More liveness records than one direct get returns (1,024 keys) are
// read in pages: the count and the known record are still right.
func TestReadManyLiveRecords(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	ctx := ctxT(t, 60*time.Second)
	const n = 1100
	beat, err := json.Marshal(Live{Beat: time.Now(), TTL: time.Hour})
	require.NoError(t, err)
	for i := range n {
		_, err := kv.Put(ctx, LiveKey(fmt.Sprintf("wf-%d", i), "id"), beat)
		require.NoError(t, err)
	}
	_, err = kv.Last(ctx, KnownKey("wf-7"), "live.>")
	require.ErrorIs(t, err, jetstream.ErrTooManyKeys, "one direct get does not hold them")
	_, err = kv.Create(ctx, KnownKey("wf-7"), []byte(`{"workflow":"wf-7","first_worker":"w-7"}`))
	require.NoError(t, err)

	s, err := Read(ctx, kv, "wf-7", time.Now())
	require.NoError(t, err)
	require.Equal(t, n, s.Live)
	require.True(t, s.Found)
	require.Equal(t, "w-7", s.Known.FirstWorker)
	s, err = Read(ctx, kv, "typo", time.Now())
	require.NoError(t, err)
	require.Equal(t, Status{Live: n}, s)
}

// List reads every known record and the current liveness records, each
// with its presence's ID: two workers serving one workflow are two
// records; a withdrawn worker's records are gone, its known records stay.
func TestListKnownAndLive(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	ctx := ctxT(t, 10*time.Second)

	known, live, err := List(ctx, kv, time.Now())
	require.NoError(t, err)
	require.Empty(t, known)
	require.Empty(t, live)

	p1, err := Announce(ctx, kv, []string{"order", "refund"}, "w-1", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	p2, err := Announce(ctx, kv, []string{"order"}, "w-2", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	known, live, err = List(ctx, kv, time.Now())
	require.NoError(t, err)
	require.Len(t, known, 2)
	for _, k := range known {
		require.Equal(t, "w-1", k.FirstWorker, k.Workflow)
	}
	served := map[string][]string{}
	ids := map[string]string{}
	for _, l := range live {
		served[l.Worker] = append(served[l.Worker], l.Workflow)
		require.NotEmpty(t, l.ID)
		require.False(t, l.Since.IsZero())
		require.False(t, l.Beat.IsZero())
		if id, ok := ids[l.Worker]; ok {
			require.Equal(t, id, l.ID, "one presence, one ID")
		}
		ids[l.Worker] = l.ID
	}
	require.ElementsMatch(t, []string{"order", "refund"}, served["w-1"])
	require.Equal(t, []string{"order"}, served["w-2"])
	require.NotEqual(t, ids["w-1"], ids["w-2"])

	require.NoError(t, p1.Stop(ctx))
	known, live, err = List(ctx, kv, time.Now())
	require.NoError(t, err)
	require.Len(t, known, 2, "known for good")
	require.Len(t, live, 1, "w-1 withdrawn")
	require.Equal(t, "w-2", live[0].Worker)
	require.NoError(t, p2.Stop(ctx))
}

// A liveness record the bucket still holds past its time (its worker gone
// for longer than two TTLs since its last beat: a removal the server undid
// after an unclean stop) is no live worker: not counted by Read, so that a
// start nobody answers is "retry later", not "unknown workflow"; not listed
// by List or Current.
func TestLivenessRecordPastItsTimeIsNoWorker(t *testing.T) {
	t.Parallel()
	kv := bucket(t, testenv.Server(t))
	ctx := ctxT(t, 10*time.Second)
	now := time.Now()
	for i, beat := range []time.Time{now.Add(-19 * time.Minute), now.Add(-3 * time.Second)} {
		b, err := json.Marshal(Live{Workflow: "order", Worker: fmt.Sprintf("gone-%d", i), Beat: beat, TTL: time.Second, Protocol: 3})
		require.NoError(t, err)
		_, err = kv.Put(ctx, LiveKey("order", fmt.Sprintf("id%d", i)), b)
		require.NoError(t, err)
	}
	s, err := Read(ctx, kv, "ordr", now)
	require.NoError(t, err)
	require.Equal(t, Status{}, s, "dead workers' records counted as live")
	_, live, err := List(ctx, kv, now)
	require.NoError(t, err)
	require.Empty(t, live)

	p, err := Announce(ctx, kv, []string{"order"}, "w-1", "b1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Stop(ctx)) }()
	s, err = Read(ctx, kv, "ordr", time.Now())
	require.NoError(t, err)
	require.Equal(t, 1, s.Live, "the live worker only")
	_, live, err = List(ctx, kv, time.Now())
	require.NoError(t, err)
	require.Len(t, live, 1)
	require.Equal(t, "w-1", live[0].Worker)
}
