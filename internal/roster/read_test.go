package roster

import (
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

	s, err := Read(ctx, kv, "order")
	require.NoError(t, err)
	require.Equal(t, Status{}, s, "a fresh deployment: nothing known, no worker live")

	p, err := Announce(ctx, kv, []string{"order", "refund"}, "w-1", ttl, testenv.Logger(t))
	require.NoError(t, err)
	s, err = Read(ctx, kv, "ordr")
	require.NoError(t, err)
	require.False(t, s.Found)
	require.Equal(t, 2, s.Live, "w-1's two liveness records")
	s, err = Read(ctx, kv, "order")
	require.NoError(t, err)
	require.True(t, s.Found)
	require.Equal(t, "w-1", s.Known.FirstWorker)

	require.NoError(t, p.Stop(ctx))
	s, err = Read(ctx, kv, "ordr")
	require.NoError(t, err)
	require.Equal(t, Status{}, s, "withdrawn: no worker live")
	s, err = Read(ctx, kv, "refund")
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
	for i := range n {
		_, err := kv.Put(ctx, LiveKey(fmt.Sprintf("wf-%d", i), "id"), []byte(`{}`))
		require.NoError(t, err)
	}
	_, err := kv.Last(ctx, KnownKey("wf-7"), "live.>")
	require.ErrorIs(t, err, jetstream.ErrTooManyKeys, "one direct get does not hold them")
	_, err = kv.Create(ctx, KnownKey("wf-7"), []byte(`{"workflow":"wf-7","first_worker":"w-7"}`))
	require.NoError(t, err)

	s, err := Read(ctx, kv, "wf-7")
	require.NoError(t, err)
	require.Equal(t, n, s.Live)
	require.True(t, s.Found)
	require.Equal(t, "w-7", s.Known.FirstWorker)
	s, err = Read(ctx, kv, "typo")
	require.NoError(t, err)
	require.Equal(t, Status{Live: n}, s)
}
