package workflow

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The goroutine ID onBody compares is the one the stack header shows, on
// every goroutine, and two goroutines never share one.
func TestGoidIsTheGoroutinesOwn(t *testing.T) {
	t.Parallel()
	const n = 50
	ids := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = goid()
			require.Equal(t, stackGoid(), ids[i])
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, id := range ids {
		require.NotZero(t, id)
		require.False(t, seen[id], "goroutine ID %d twice", id)
		seen[id] = true
	}
	require.Equal(t, stackGoid(), goid())
	// On the toolchain the project builds with, the fast read is the one in
	// use: a runtime it does not know falls back to the stack header, which
	// costs every body call a microsecond or more.
	require.True(t, goidFast, "the goroutine ID is read off the stack header (slow): update github.com/petermattis/goid")
}
