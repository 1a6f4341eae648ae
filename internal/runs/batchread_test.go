package runs

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// Waits started together share their first reads: 400 reads asked at once
// cost the server a few batch reads, each read gets its own record (or
// ErrNotFound), and a lone read afterwards goes out at once.
func TestWaitsStartedTogetherShareTheirReads(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	assets, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	s := New(assets)
	const n = 400
	for i := range n {
		_, err := s.Create(ctx(t), running(fmt.Sprintf("b-%d", i), "a"))
		require.NoError(t, err)
	}
	// The tap's messages go to a channel from its connection's read loop:
	// once a Flush returns, every read the server took before is in it.
	tap := testenv.Conn(t, srv)
	seen := make(chan *nats.Msg, 4*n)
	for _, subject := range []string{"$JS.API.DIRECT.GET.KV_" + s.Name(), "$JS.API.DIRECT.GET.KV_" + s.Name() + ".>"} {
		sub, err := tap.ChanSubscribe(subject, seen)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, tap.Flush())
	var reads atomic.Int64
	count := func() int64 {
		require.NoError(t, tap.Flush())
		for {
			select {
			case <-seen:
				reads.Add(1)
			default:
				return reads.Load()
			}
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	for i := range n + 1 { // and one that has no record
		wg.Go(func() {
			id := fmt.Sprintf("b-%d", i)
			r, _, err := s.reads.get(ctx(t), id)
			switch {
			case i == n && !errors.Is(err, ErrNotFound):
				err = fmt.Errorf("%s: got %v, want not found", id, err)
			case i == n:
				err = nil
			case err == nil && r.RunID != id:
				err = fmt.Errorf("read of %s got %s", id, r.RunID)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Less(t, count(), int64(n/4), "reads for %d waits started at once", n+1)

	before := count()
	r, _, err := s.reads.get(ctx(t), "b-7")
	require.NoError(t, err)
	require.Equal(t, "b-7", r.RunID)
	require.Equal(t, before+1, count(), "a lone read")
}
