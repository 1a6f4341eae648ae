package jetstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// keysOf are the keys and values of entries, in their order.
func keysOf(entries []Entry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key + "=" + string(e.Value)
	}
	return out
}

// Prefix reads the latest value of each key under the prefix, in revision
// order, without deleted keys or the keys of another prefix; with upTo it
// reads only the keys last written at or before that revision (a key
// rewritten or deleted after it is left out). Last reads named keys.
func TestPrefixAndLastReadSnapshots(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	kv := a.Steps
	put := func(key, value string) uint64 {
		t.Helper()
		rev, err := kv.Put(ctx(t), key, []byte(value))
		require.NoError(t, err)
		return rev
	}
	put("r.a", "1")
	put("r.b", "1")
	put("other.a", "x")
	mid := put("r.c", "1")
	put("r.a", "2")
	require.NoError(t, kv.Raw().Delete(ctx(t), "r.b"))
	put("r.d", "1")

	got, err := kv.Prefix(ctx(t), "r", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"r.c=1", "r.a=2", "r.d=1"}, keysOf(got))

	got, err = kv.Prefix(ctx(t), "r", mid)
	require.NoError(t, err)
	require.Equal(t, []string{"r.c=1"}, keysOf(got), "the keys last written at or before revision %d", mid)

	got, err = kv.Last(ctx(t), "r.a", "r.b", "r.none")
	require.NoError(t, err)
	require.Equal(t, []string{"r.a=2"}, keysOf(got))
}

// More keys than one direct get answers are read in pages, with the same
// result: the latest of each, deleted keys left out, upTo respected.
// (Assertions on lengths and a few keys: a failure prints 1,500 keys.)
func TestPrefixReadsManyKeysInPages(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	kv := a.Steps
	const n = 1500
	var mid uint64
	for i := range n {
		rev, err := kv.Put(ctx(t), fmt.Sprintf("r.k%04d", i), []byte("1"))
		require.NoError(t, err)
		if i == n-101 {
			mid = rev
		}
	}
	_, err := kv.Put(ctx(t), "r.k0000", []byte("2"))
	require.NoError(t, err)
	require.NoError(t, kv.Raw().Delete(ctx(t), "r.k0001"))

	got, err := kv.Prefix(ctx(t), "r", 0)
	require.NoError(t, err)
	require.Equal(t, n-1, len(got))
	require.Equal(t, "r.k0000=2", keysOf(got)[n-2], "the rewritten key at its latest revision, last")
	for _, e := range got {
		require.NotEqual(t, "r.k0001", e.Key, "deleted")
	}

	got, err = kv.Prefix(ctx(t), "r", mid)
	require.NoError(t, err)
	require.Equal(t, n-102, len(got), "the first n-100 keys but the rewritten and the deleted one")
	require.Equal(t, "r.k0002=1", keysOf(got)[0])
	require.Equal(t, fmt.Sprintf("r.k%04d=1", n-101), keysOf(got)[len(got)-1])
}

// PrefixFenced answers only with a snapshot that holds the fence key at
// the revision asked for or later: an older one is read again until the
// context ends, with a retryable error.
func TestPrefixFencedWaitsForTheFence(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	kv := a.Steps
	rev, err := kv.Put(ctx(t), "r.lease", []byte("1"))
	require.NoError(t, err)
	got, err := kv.PrefixFenced(ctx(t), "r", "r.lease", rev)
	require.NoError(t, err)
	require.Equal(t, []string{"r.lease=1"}, keysOf(got))

	short, cancel := context.WithTimeout(ctx(t), 50*time.Millisecond)
	defer cancel()
	_, err = kv.PrefixFenced(short, "r", "r.lease", rev+2)
	require.ErrorIs(t, err, ErrUnavailable, "a fence never reached is a retryable answer")

	type answer struct {
		got []Entry
		err error
	}
	done := make(chan answer, 1)
	go func() {
		got, err := kv.PrefixFenced(ctx(t), "r", "r.lease", rev+2)
		done <- answer{got, err}
	}()
	_, err = kv.Put(ctx(t), "r.step", []byte("s"))
	require.NoError(t, err)
	_, err = kv.Put(ctx(t), "r.lease", []byte("2"))
	require.NoError(t, err)
	a2 := <-done
	require.NoError(t, a2.err)
	require.Equal(t, []string{"r.step=s", "r.lease=2"}, keysOf(a2.got))
}
