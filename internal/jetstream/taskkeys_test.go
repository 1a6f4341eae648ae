package jetstream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWholeSecondsRoundsUp(t *testing.T) {
	t.Parallel()
	for in, want := range map[time.Duration]time.Duration{
		0: time.Second, 300 * time.Millisecond: time.Second, time.Second: time.Second,
		1500 * time.Millisecond: 2 * time.Second, 2 * time.Second: 2 * time.Second, time.Hour + 1: time.Hour + time.Second,
	} {
		require.Equal(t, want, WholeSeconds(in), in)
	}
}

// waitGone polls key until its last message is a marker and returns when
// that was seen. Polling a deadline, not sleeping a guess.
func waitGone(t *testing.T, tk *TaskKeys, key string, within time.Duration) (KeyState, time.Time) {
	t.Helper()
	var st KeyState
	var at time.Time
	require.Eventually(t, func() bool {
		s, err := tk.Latest(ctx(t), key)
		if err != nil {
			return false
		}
		st, at = s, time.Now()
		return !st.Live
	}, within, 20*time.Millisecond)
	return st, at
}

// The facts the task keys rely on, on nats-server 2.15 / nats.go 1.55: a
// key written with a message TTL expires by itself and leaves a marker
// (LimitMarkerTTL); a create-if-absent with expected revision 0 then fails
// (the marker is the subject's last message), and one against the marker's
// revision succeeds; watchers see the expiry; a rewrite with another TTL
// replaces the first one.
func TestTaskKeysPerKeyTTL(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	tk := a.TaskKeys

	st, err := tk.Latest(ctx(t), "g.k1.s")
	require.NoError(t, err)
	require.Equal(t, KeyState{}, st, "never written")

	w, err := tk.Watch(ctx(t), "g.k1.s")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()

	written := time.Now()
	rev, err := tk.Create(ctx(t), "g.k1.s", []byte("v1"), 0, time.Second)
	require.NoError(t, err)
	_, err = tk.Create(ctx(t), "g.k1.s", []byte("again"), 0, time.Second)
	require.ErrorIs(t, err, ErrExists)

	st, gone := waitGone(t, tk, "g.k1.s", 10*time.Second)
	require.GreaterOrEqual(t, gone.Sub(written), time.Second, "expired before its TTL")
	require.Greater(t, st.Rev, rev, "a marker replaced the value")

	// The watch saw the value, then the expiry.
	var revs []uint64
	for len(revs) < 2 {
		select {
		case e := <-w.Updates():
			if e != nil {
				revs = append(revs, e.Revision())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watch saw %v, want the write and the expiry", revs)
		}
	}
	require.Equal(t, []uint64{rev, st.Rev}, revs)

	// Plain create-if-absent is refused by the marker; against it, it works.
	kv, err := tk.Bind(ctx(t))
	require.NoError(t, err)
	_, err = kv.CreateTTL(ctx(t), "g.k1.s", []byte("v2"), time.Minute)
	require.ErrorIs(t, err, ErrExists)
	rev2, err := tk.Create(ctx(t), "g.k1.s", []byte("v2"), st.Rev, time.Minute)
	require.NoError(t, err)
	_, err = tk.Create(ctx(t), "g.k1.s", []byte("v3"), st.Rev, time.Minute)
	require.ErrorIs(t, err, ErrExists, "a second create against the same marker")

	// Replace carries its own TTL: from a minute down to one second.
	rev3, err := tk.Replace(ctx(t), "g.k1.s", []byte("short"), rev2, time.Second)
	require.NoError(t, err)
	_, err = tk.Replace(ctx(t), "g.k1.s", []byte("stale"), rev2, time.Minute)
	require.ErrorIs(t, err, ErrRevisionMismatch)
	st, _ = waitGone(t, tk, "g.k1.s", 10*time.Second)
	require.Greater(t, st.Rev, rev3)
}

// Release is a purge with compare-and-set; Keys lists the keys of a
// filter that hold a value, and nothing else.
func TestTaskKeysReleaseAndKeys(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	tk := a.TaskKeys

	rev, err := tk.Create(ctx(t), "w.wf.h1.a", []byte("claim"), 0, time.Minute)
	require.NoError(t, err)
	require.ErrorIs(t, tk.Release(ctx(t), "w.wf.h1.a", rev+1), ErrRevisionMismatch)
	require.NoError(t, tk.Release(ctx(t), "w.wf.h1.a", rev))
	st, err := tk.Latest(ctx(t), "w.wf.h1.a")
	require.NoError(t, err)
	require.False(t, st.Live)
	keys, err := tk.Keys(ctx(t), "w.wf.h1.*")
	require.NoError(t, err)
	require.Empty(t, keys, "a released key is listed")
	_, err = tk.Create(ctx(t), "w.wf.h1.a", []byte("again"), st.Rev, time.Minute)
	require.NoError(t, err)

	for _, k := range []string{"w.wf.h1.b", "w.wf.h2.a", "w.other.h1.a", "g.h1.a"} {
		_, err := tk.Create(ctx(t), k, []byte("x"), 0, time.Minute)
		require.NoError(t, err)
	}
	keys, err = tk.Keys(ctx(t), "w.wf.h1.*")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"w.wf.h1.a", "w.wf.h1.b"}, keys)
}
