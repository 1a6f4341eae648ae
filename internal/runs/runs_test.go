package runs

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

func setup(t *testing.T, topo jetstream.Topology) (*Store, *jetstream.Assets) {
	t.Helper()
	nc := testenv.Conn(t, testenv.Server(t))
	assets, err := jetstream.Provision(ctx(t), nc, topo, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	return New(assets), assets
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func running(id, token string) state.Run {
	now := time.Now().UTC()
	return state.Run{V: state.Version, RunID: id, Workflow: "w", Input: json.RawMessage(`1`),
		Status: state.StatusRunning, Token: token, CreatedAt: now, UpdatedAt: now}
}

// ttlOf reads the Nats-TTL header of the record's last message.
func ttlOf(t *testing.T, assets *jetstream.Assets, id string) string {
	t.Helper()
	st, err := assets.JS.Stream(ctx(t), "KV_"+assets.Runs.Bucket())
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx(t), "$KV."+assets.Runs.Bucket()+"."+id)
	require.NoError(t, err)
	return nats.Header(m.Header).Get("Nats-TTL")
}

// A running record never expires; the write that ends it carries the
// run's retention, or the deployment's when the run has none.
func TestTTLFollowsStatus(t *testing.T) {
	t.Parallel()
	s, assets := setup(t, jetstream.Topology{Retention: time.Hour})
	_, err := s.Create(ctx(t), running("r-1", "a"))
	require.NoError(t, err)
	require.Equal(t, "never", ttlOf(t, assets, "r-1"))
	_, err = s.Create(ctx(t), running("r-1", "b"))
	require.ErrorIs(t, err, jetstream.ErrExists)

	run, written, err := s.Finish(ctx(t), running("r-1", "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.True(t, written)
	require.Equal(t, state.StatusCompleted, run.Status)
	require.Equal(t, "1h0m0s", ttlOf(t, assets, "r-1"))

	own := running("r-2", "a")
	own.Retention = 2 * time.Second
	require.Equal(t, 2*time.Second, s.Retention(own))
	require.Equal(t, time.Hour, s.Retention(running("x", "y")))
	_, err = s.Create(ctx(t), own)
	require.NoError(t, err)
	_, cancelled, err := s.Cancel(ctx(t), "r-2")
	require.NoError(t, err)
	require.True(t, cancelled)
	require.Equal(t, "2s", ttlOf(t, assets, "r-2"))
}

// Finish on a stale revision reads again; it leaves a record that ended,
// or that holds another run (token, generation), as it is.
func TestFinishOwnsOnlyItsRun(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	rev, err := s.Create(ctx(t), running("f-1", "a"))
	require.NoError(t, err)
	// Another writer moves the record on: Finish's revision is stale.
	moved := running("f-1", "a")
	moved.Source = "moved"
	_, err = s.Replace(ctx(t), moved, rev)
	require.NoError(t, err)
	calls := 0
	run, written, err := s.Finish(ctx(t), running("f-1", "a"), rev, func(r *state.Run) {
		calls++
		r.Status = state.StatusFailed
	})
	require.NoError(t, err)
	require.True(t, written)
	require.Equal(t, 2, calls, "applied again after the conflict")
	require.Equal(t, "moved", run.Source, "on the record read again")

	_, written, err = s.Finish(ctx(t), running("f-1", "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.False(t, written, "already ended")

	_, err = s.Create(ctx(t), running("f-2", "new"))
	require.NoError(t, err)
	_, written, err = s.Finish(ctx(t), running("f-2", "old"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.False(t, written, "another token")
	other := running("f-2", "new")
	other.Generation = 1
	_, written, err = s.Finish(ctx(t), other, 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.False(t, written, "another generation")
	got, _, err := s.Get(ctx(t), "f-2")
	require.NoError(t, err)
	require.Equal(t, state.StatusRunning, got.Status)
}

func TestCancelUpdateAndNotFound(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	_, _, err := s.Get(ctx(t), "none")
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = s.Cancel(ctx(t), "none")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Wait(ctx(t), "none")
	require.ErrorIs(t, err, ErrNotFound)

	_, err = s.Create(ctx(t), running("c-1", "a"))
	require.NoError(t, err)
	run, cancelled, err := s.Cancel(ctx(t), "c-1")
	require.NoError(t, err)
	require.True(t, cancelled)
	require.Equal(t, state.StatusCancelled, run.Status)
	require.Equal(t, "cancelled", run.Error.Kind)
	run, cancelled, err = s.Cancel(ctx(t), "c-1")
	require.NoError(t, err)
	require.False(t, cancelled, "a second cancel changes nothing")
	require.Equal(t, state.StatusCancelled, run.Status)

	_, written, err := s.Update(ctx(t), "c-1", func(*state.Run) (bool, error) { return false, nil })
	require.NoError(t, err)
	require.False(t, written)
}

// Wait returns a run's final record, also when it ends after the wait
// began; every status change is in the run index, newest first, the
// state the run left removed.
func TestWaitAndIndex(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	for _, id := range []string{"k-3", "k-1", "k-2"} {
		_, err := s.Create(ctx(t), running(id, "a"))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"k-2", "k-1", "k-3"}, indexed(t, s, ""))

	done := make(chan state.Run, 1)
	errs := make(chan error, 1)
	wctx := ctx(t)
	go func() {
		r, err := s.Wait(wctx, "k-2")
		errs <- err
		done <- r
	}()
	_, _, err := s.Finish(ctx(t), running("k-2", "a"), 0, func(r *state.Run) {
		r.Status, r.Output = state.StatusCompleted, json.RawMessage(`7`)
	})
	require.NoError(t, err)
	require.NoError(t, <-errs)
	r := <-done
	require.Equal(t, state.StatusCompleted, r.Status)
	require.JSONEq(t, `7`, string(r.Output))
	require.Equal(t, []string{"k-2", "k-1", "k-3"}, indexed(t, s, ""))
	require.Equal(t, []string{"k-2"}, indexed(t, s, state.StatusCompleted))
	require.Equal(t, []string{"k-1", "k-3"}, indexed(t, s, state.StatusRunning), "the running entry of k-2 is gone")

	r, err = s.Wait(ctx(t), "k-2")
	require.NoError(t, err, "already final")
	require.Equal(t, state.StatusCompleted, r.Status)
}

func TestAuditCountsDuplicates(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	au, err := s.Audit(ctx(t), "a-1")
	require.NoError(t, err)
	require.Zero(t, au.Duplicates)
	for i := 1; i <= 3; i++ {
		n, err := s.RecordDuplicate(ctx(t), "a-1", state.AuditEntry{At: time.Now().UTC(), Source: "t", Outcome: state.AuditExisting})
		require.NoError(t, err)
		require.Equal(t, int64(i), n)
	}
	au, err = s.Audit(ctx(t), "a-1")
	require.NoError(t, err)
	require.Equal(t, int64(3), au.Duplicates)
}

// silentWatch is a watch that reports it has caught up and then nothing
// more, as a watch whose consumer was lost with a stream leader.
type silentWatch struct {
	updates chan natsjs.KeyValueEntry
	once    *sync.Once
}

func (w silentWatch) Updates() <-chan natsjs.KeyValueEntry { return w.updates }
func (w silentWatch) Stop() error {
	w.once.Do(func() { close(w.updates) })
	return nil
}

// A waiter whose shared watch falls silent still sees the run end: a check
// finds a record stored and not delivered, and the replacement watch
// resumes after the last record delivered.
func TestWaitSeesTheEndWhenTheWatchFallsSilent(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	s.waiters.check = 50 * time.Millisecond
	real := s.waiters.watch
	var watches atomic.Int32
	s.waiters.watch = func(ctx context.Context, after uint64) (natsjs.KeyWatcher, error) {
		if watches.Add(1) == 1 {
			w := silentWatch{updates: make(chan natsjs.KeyValueEntry, 1), once: new(sync.Once)}
			w.updates <- nil
			return w, nil
		}
		return real(ctx, after)
	}
	_, err := s.Create(ctx(t), running("r-w", "a"))
	require.NoError(t, err)

	type result struct {
		run state.Run
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.Wait(ctx(t), "r-w")
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("Wait returned before the run ended: %+v", r)
	case <-time.After(5 * s.waiters.check): // several checks saw nothing stored
	}
	require.Equal(t, int32(1), watches.Load(), "a quiet bucket is not a silent watch")
	_, written, err := s.Finish(ctx(t), running("r-w", "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.True(t, written)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Equal(t, state.StatusCompleted, r.run.Status)
	case <-ctx(t).Done():
		t.Fatal("Wait did not see the run end after its watch fell silent")
	}
	require.GreaterOrEqual(t, watches.Load(), int32(2), "the silent watch was replaced")
}

// Waiting for many runs at once costs the server one consumer, as waiting
// for one does; each wait gets its own run's final record, and the watch
// stops once nobody waits.
func TestWaitersShareOneConsumer(t *testing.T) {
	t.Parallel()
	s, a := setup(t, jetstream.Topology{})
	s.waiters.check = 50 * time.Millisecond
	const n = 300
	for i := range n {
		_, err := s.Create(ctx(t), running(fmt.Sprintf("r-%d", i), "a"))
		require.NoError(t, err)
	}
	consumers := func() int {
		t.Helper()
		info, err := a.JS.Stream(ctx(t), "KV_"+s.Name())
		require.NoError(t, err)
		return info.CachedInfo().State.Consumers
	}
	require.Equal(t, 0, consumers())

	errs := make(chan error, n)
	for i := range n {
		go func() {
			id := fmt.Sprintf("r-%d", i)
			r, err := s.Wait(ctx(t), id)
			if err == nil && (r.RunID != id || r.Status != state.StatusCompleted) {
				err = fmt.Errorf("wait for %s got %s %s", id, r.RunID, r.Status)
			}
			errs <- err
		}()
	}
	waitingOn(t, s, n) // every wait registered, the watch set up, before any run ends
	require.Equal(t, 1, consumers(), "%d waits, one consumer", n)
	for i := range n {
		_, _, err := s.Finish(ctx(t), running(fmt.Sprintf("r-%d", i), "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
		require.NoError(t, err)
	}
	for range n {
		require.NoError(t, <-errs)
	}
	require.Eventually(t, func() bool { return consumers() == 0 }, 10*time.Second, s.waiters.check, "the watch stops once nobody waits")
}

// indexed lists the run IDs of the run index's first page of status ("":
// all).
func indexed(t *testing.T, s *Store, status state.Status, attrs ...map[string]string) []string {
	t.Helper()
	q := runindex.Query{Status: status, Limit: 50}
	if len(attrs) > 0 {
		q.Attributes = attrs[0]
	}
	page, err := s.Index().Page(ctx(t), q)
	require.NoError(t, err)
	var ids []string
	for _, e := range page.Entries {
		ids = append(ids, e.RunID)
	}
	return ids
}

// Repair removes a stale entry once the run's own entry is there; it
// writes the run's own entry only when that is missing although the
// record was written over RepairGrace ago (its writer died between the
// record and the index); within the grace it leaves everything to the
// writer. An entry without a record goes alone.
func TestRepairStaleIndexEntry(t *testing.T) {
	t.Parallel()
	s, a := setup(t, jetstream.Topology{})
	_, err := s.Create(ctx(t), running("r-1", "a"))
	require.NoError(t, err)
	done, _, err := s.Finish(ctx(t), running("r-1", "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	page, err := s.Index().Page(ctx(t), runindex.Query{Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	current := page.Entries[0]
	stale := running("r-1", "a")
	putStale := func() runindex.Entry {
		t.Helper()
		seq, err := s.Index().Put(ctx(t), stale, jetstream.TTLNever)
		require.NoError(t, err)
		e := runindex.EntryOf(stale)
		e.Seq = seq
		return e
	}

	// The writer is done: the stale entry goes.
	require.NoError(t, s.Repair(ctx(t), putStale(), &done))
	require.Equal(t, []string{"r-1"}, indexed(t, s, state.StatusCompleted))
	require.Empty(t, indexed(t, s, state.StatusRunning))

	// A writer between its two writes (or dead): only the running entry.
	e := putStale()
	require.NoError(t, s.Index().RemoveEntry(ctx(t), current))
	require.NoError(t, s.Repair(ctx(t), e, &done))
	require.Equal(t, []string{"r-1"}, indexed(t, s, state.StatusRunning), "within the grace the reader leaves it to the writer")

	// After the grace: the missing entry is written, the stale one goes.
	s.now = func() time.Time { return time.Now().Add(RepairGrace + time.Second) }
	require.NoError(t, s.Repair(ctx(t), e, &done))
	require.Equal(t, []string{"r-1"}, indexed(t, s, state.StatusCompleted))
	require.Empty(t, indexed(t, s, state.StatusRunning))

	// No record: the entry goes, a newer one of the run ID stays.
	ghost := running("r-ghost", "g")
	seq, err := s.Index().Put(ctx(t), ghost, jetstream.TTLNever)
	require.NoError(t, err)
	old := runindex.EntryOf(ghost)
	old.Seq = seq
	_, err = s.Index().Put(ctx(t), running("r-ghost", "g2"), jetstream.TTLNever) // a new run under the ID, written since
	require.NoError(t, err)
	require.NoError(t, s.Repair(ctx(t), old, nil))
	require.Contains(t, indexed(t, s, state.StatusRunning), "r-ghost")

	// The same entry put again (a retried write, or a rebuild's) stays
	// where it is: moving it would hide it from a walk in progress.
	same := running("r-same", "s") // with its token: its writer's entry
	first, err := s.Index().Put(ctx(t), same, jetstream.TTLNever)
	require.NoError(t, err)
	again, err := s.Index().Put(ctx(t), same, jetstream.TTLNever)
	require.NoError(t, err)
	require.Equal(t, first, again)

	// An entry written late for a running run never expires.
	late := running("r-late", "l")
	late.UpdatedAt = time.Now().Add(-time.Hour)
	b, err := state.Encode(late)
	require.NoError(t, err)
	_, err = a.Runs.CreateTTL(ctx(t), "r-late", b, jetstream.TTLNever) // the record alone
	require.NoError(t, err)
	written, err := s.EnsureIndexed(ctx(t), "r-late")
	require.NoError(t, err)
	require.True(t, written)
	msg, err := a.Index.GetLastMsgForSubject(ctx(t), "jetflow.runindex.e.running.w.r.-.l.a.t.e.~") // the run ID one character per token
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get("Nats-TTL"), "a running run's entry has no expiry")
	written, err = s.EnsureIndexed(ctx(t), "r-late")
	require.NoError(t, err)
	require.False(t, written, "once is enough")
}

// A run with two entries for a moment (its writer between its two
// writes) shows once, and a page that drops its second entry still says
// that older runs follow.
func TestIndexPageCountsRunsNotEntries(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	put := func(id, wf string) {
		t.Helper()
		r := running(id, "t")
		r.Workflow = wf
		_, err := s.Index().Put(ctx(t), r, jetstream.TTLNever)
		require.NoError(t, err)
	}
	put("old", "w")
	for i := range 130 {
		put(fmt.Sprintf("x-%03d", i), "x")
	}
	put("a", "w")
	put("b", "w")
	put("b", "w")
	var ids []string
	q := runindex.Query{Workflow: "w", Limit: 2}
	for pages := 0; pages < 5; pages++ {
		page, err := s.Index().Page(ctx(t), q)
		require.NoError(t, err)
		for _, e := range page.Entries {
			ids = append(ids, e.RunID)
		}
		if page.Next == 0 {
			break
		}
		q.Before = page.Next
	}
	require.Equal(t, []string{"b", "a", "old"}, ids)
}

// A run admitted by one process and ended by a worker before the
// admitting process wrote its running entry: the late running entry is
// removed once written (the record has moved on), so the run is not
// counted as running for ever. Its attribute entries likewise.
func TestLateRunningEntryIsDropped(t *testing.T) {
	t.Parallel()
	s, a := setup(t, jetstream.Topology{})
	run := running("late-1", "a")
	byOrder := map[string]string{"order_id": "1"}
	run.Attributes = byOrder
	b, err := state.Encode(run)
	require.NoError(t, err)
	_, err = a.Runs.CreateTTL(ctx(t), run.RunID, b, jetstream.TTLNever) // the admission's record; its entry comes late
	require.NoError(t, err)
	_, _, err = s.Finish(ctx(t), run, 0, func(r *state.Run) { r.Status = state.StatusFailed })
	require.NoError(t, err)
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed, byOrder))

	seq, err := s.Index().Put(ctx(t), run, jetstream.TTLNever) // the admission's entry, late
	require.NoError(t, err)
	seqs, err := s.Index().PutAttributes(ctx(t), run, jetstream.TTLNever)
	require.NoError(t, err)
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusRunning))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusRunning, byOrder))
	require.NoError(t, s.dropIfOvertaken(ctx(t), run, seq, seqs))
	require.Empty(t, indexed(t, s, state.StatusRunning))
	require.Empty(t, indexed(t, s, state.StatusRunning, byOrder))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed, byOrder), "the worker's attribute entry stays")

	// A start of a run already ended writes no running entry: the failed
	// entry is there, so its first write refuses.
	_, err = s.Create(ctx(t), run)
	require.ErrorIs(t, err, jetstream.ErrExists)
	require.Empty(t, indexed(t, s, state.StatusRunning))
	require.Empty(t, indexed(t, s, state.StatusRunning, byOrder))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed))
	require.Equal(t, []string{"late-1"}, indexed(t, s, state.StatusFailed, byOrder))

	// Nor does one whose run ID holds an ended record without an entry:
	// the running entry written before the record is removed once the
	// record's create finds the ID taken.
	ended := running("ended-1", "a")
	ended.Status = state.StatusCompleted
	b, err = state.Encode(ended)
	require.NoError(t, err)
	_, err = a.Runs.CreateTTL(ctx(t), ended.RunID, b, time.Hour)
	require.NoError(t, err)
	_, err = s.Create(ctx(t), running("ended-1", "a"))
	require.ErrorIs(t, err, jetstream.ErrExists)
	require.Empty(t, indexed(t, s, state.StatusRunning))

	// A running entry that is the record's own stays.
	live := running("live-1", "b")
	_, err = s.Create(ctx(t), live)
	require.NoError(t, err)
	require.Equal(t, []string{"live-1"}, indexed(t, s, state.StatusRunning))

	// An earlier run's entry that outlived its record does not keep the
	// new run under its ID out of the index.
	old := running("reused-1", "c")
	oldSeq, err := s.Index().Put(ctx(t), old, jetstream.TTLNever) // no record: it expired
	require.NoError(t, err)
	reused := running("reused-1", "d")
	_, err = s.Create(ctx(t), reused)
	require.NoError(t, err)
	msg, err := a.Index.GetLastMsgForSubject(ctx(t), "jetflow.runindex.e.running.w.r.e.u.s.e.d.-.1.~")
	require.NoError(t, err)
	require.Greater(t, msg.Sequence, oldSeq, "the new run's entry is written")
}

// A wait in progress when the client's connection closes returns a
// retryable error within a check period, instead of waiting for its
// context.
func TestWaitReturnsWhenTheConnectionCloses(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	assets, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	s := New(assets)
	s.waiters.check = 50 * time.Millisecond
	_, err = s.Create(ctx(t), running("r-c", "a"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx(t), "r-c")
		done <- err
	}()
	waitingOn(t, s, 1)
	nc.Close()
	select {
	case err := <-done:
		require.ErrorIs(t, err, jetstream.ErrUnavailable)
	case <-time.After(100 * s.waiters.check):
		t.Fatal("Wait still waits although its connection is closed")
	}
}

// A watch that is stopped while its delivery channel is full (the hub
// busy with a check, other runs written meanwhile) does not leave the
// watch's delivery goroutine blocked for good.
func TestStoppedWatchIsDrained(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	s.waiters.check = 50 * time.Millisecond
	realLast := s.waiters.lastSeq
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var armed atomic.Bool
	idle := func() bool {
		s.waiters.mu.Lock()
		defer s.waiters.mu.Unlock()
		return s.waiters.count == 0
	}
	s.waiters.lastSeq = func(ctx context.Context) (uint64, error) {
		// The first check once nobody waits is made slow. Armed before the
		// run ends, so that check cannot have passed before the test looks
		// (on a loaded machine the hub can stop within two check periods
		// of the wait's return).
		if armed.Load() && idle() {
			select {
			case entered <- struct{}{}:
				<-release // a slow check: the hub reads no update meanwhile
			default:
			}
		}
		return realLast(ctx)
	}
	_, err := s.Create(ctx(t), running("r-l", "a"))
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() {
		_, err := s.Wait(ctx(t), "r-l")
		waited <- err
	}()
	waitingOn(t, s, 1)
	armed.Store(true) // once nobody waits, the next checks stop the hub
	_, _, err = s.Finish(ctx(t), running("r-l", "a"), 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)
	require.NoError(t, <-waited)
	select {
	case <-entered:
	case <-ctx(t).Done():
		t.Fatal("the hub made no check once nobody waited")
	}
	for i := range 600 { // more than the watch's channel holds
		_, err := s.runs.Raw().Put(ctx(t), fmt.Sprintf("other-%d", i), []byte(`{}`))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return len(blockedWatchCallbacks()) > 0 }, 10*time.Second, 5*time.Millisecond,
		"the watch's delivery blocks on its full channel")
	close(release)
	require.Eventually(t, func() bool {
		s.waiters.mu.Lock()
		defer s.waiters.mu.Unlock()
		return s.waiters.cur == nil
	}, 10*time.Second, time.Millisecond, "the hub stops")
	require.Eventually(t, func() bool { return len(blockedWatchCallbacks()) == 0 }, 10*time.Second, 5*time.Millisecond,
		"a stopped watch's delivery stays blocked:\n%s", strings.Join(blockedWatchCallbacks(), "\n\n"))
}

// waitingOn waits until n waits are registered with s's shared watch and
// the watch is set up.
func waitingOn(t *testing.T, s *Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.waiters.mu.Lock()
		defer s.waiters.mu.Unlock()
		if s.waiters.count != n || s.waiters.cur == nil {
			return false
		}
		select {
		case <-s.waiters.cur.ready:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond)
}

// blockedWatchCallbacks are the stacks of KV watch deliveries blocked
// sending to their watcher's channel.
func blockedWatchCallbacks() []string {
	buf := make([]byte, 1<<22)
	n := runtime.Stack(buf, true)
	var stuck []string
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		// The watch's goroutine, blocked in its own select (a send), not
		// in the iterator it reads from.
		lines := strings.SplitN(g, "\n", 3)
		if len(lines) > 1 && strings.Contains(lines[1], "headerWatcher).run") {
			stuck = append(stuck, g)
		}
	}
	return stuck
}

// A wait whose context has ended returns the context's error, never a
// retryable one, also while the shared watch is up for other waits.
func TestWaitWithAnEndedContextReturnsItsError(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, jetstream.Topology{})
	_, err := s.Create(ctx(t), running("r-e", "a"))
	require.NoError(t, err)
	held, stop := context.WithCancel(ctx(t))
	defer stop()
	go func() { _, _ = s.Wait(held, "r-e") }() // keeps the watch up
	waitingOn(t, s, 1)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for range 100 {
		_, err := s.Wait(expired, "r-e")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, jetstream.ErrUnavailable)
	}
}

// An entry written onto a subject that already holds one — the entry a
// rebuild of the index wrote from the record while the run's own write was
// being retried, or a repeat write — replaces it: the run is counted once.
func TestEntryWrittenAfterARebuildIsCountedOnce(t *testing.T) {
	t.Parallel()
	s, assets := setup(t, jetstream.Topology{})
	run := running("r", "t")
	_, err := s.Create(ctx(t), run)
	require.NoError(t, err)
	run.Status = state.StatusCompleted
	_, _, err = s.Finish(ctx(t), run, 0, func(r *state.Run) { r.Status = state.StatusCompleted })
	require.NoError(t, err)

	require.NoError(t, assets.JS.DeleteStream(ctx(t), jetstream.IndexStream))
	require.NoError(t, assets.EnsureIndexStream(ctx(t)))
	rebuilt, err := s.EnsureIndex(ctx(t))
	require.NoError(t, err)
	require.True(t, rebuilt)
	for range 2 { // the late write of the run's end, and a repeat of it
		_, err = s.Index().Put(ctx(t), run, jetstream.TTLNever)
		require.NoError(t, err)
	}
	counts, err := s.Index().Count(ctx(t), "w")
	require.NoError(t, err)
	require.Equal(t, int64(1), counts[state.StatusCompleted])
	require.Equal(t, int64(0), counts[state.StatusRunning])
}
