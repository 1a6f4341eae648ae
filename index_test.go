package jetflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// TestRunIndexRebuiltWhenRemoved: the run index stream deleted by hand
// (or lost) is made again from the run records — by the next listing, and
// by a worker that starts — with every kept run, including one that ended
// while the index was missing.
func TestRunIndexRebuiltWhenRemoved(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("indexed", func(ctx *Context, in int) (int, error) {
		if in%4 == 0 {
			return 0, Fatal(errors.New("no"))
		}
		return in, nil
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	var want []string
	start := func(i int) {
		id := fmt.Sprintf("idx-%02d", i)
		want = append(want, id)
		_, err := c.StartByName(ctx, "indexed", json.RawMessage(fmt.Sprint(i)), WithRunID(id))
		require.NoError(t, err)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		awaitIndexed(t, c, id, run.Status)
	}
	for i := range 20 {
		start(i)
	}
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)

	// Gone, then a run ends while it is gone: its entry cannot be written.
	require.NoError(t, js.DeleteStream(ctx, jetstream.IndexStream))
	_, err = c.StartByName(ctx, "indexed", json.RawMessage(`21`), WithRunID("idx-21"))
	require.NoError(t, err)
	_, err = c.WaitRun(ctx, "idx-21")
	require.NoError(t, err)
	want = append(want, "idx-21")

	// The next listing finds it missing and rebuilds it.
	require.ElementsMatch(t, want, runIDs(walkAll(t, c, ListOptions{Limit: 7})))
	// A time range reads the runs' own times, not the rebuilt entries'.
	tenth, err := c.GetRun(ctx, "idx-10")
	require.NoError(t, err)
	require.ElementsMatch(t, want[:10], runIDs(walkAll(t, c, ListOptions{Until: tenth.UpdatedAt, Limit: 7})))
	require.ElementsMatch(t, want[10:], runIDs(walkAll(t, c, ListOptions{Since: tenth.UpdatedAt, Limit: 7})))
	counts, err := c.CountRuns(ctx, "indexed")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Completed: 16, Failed: 5}, counts)

	// Gone again: a worker that starts builds it before it serves.
	require.NoError(t, js.DeleteStream(ctx, jetstream.IndexStream))
	env.worker(WorkerConfig{}, wf)
	info, err := js.Stream(ctx, jetstream.IndexStream)
	require.NoError(t, err, "the worker made the index again")
	require.Equal(t, uint64(21+1), info.CachedInfo().State.Msgs, "an entry per run and the build marker")
	require.ElementsMatch(t, want, runIDs(walkAll(t, c, ListOptions{Limit: 7})))
}

// TestRunIndexPagesWhileRunsStartAndExpire: while runs are started and
// expire (a workflow with a 1s retention), every walk of the pages lists
// each run at most once, always lists every kept run of another workflow
// exactly once, and lists no run whose record is gone.
func TestRunIndexPagesWhileRunsStartAndExpire(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: time.Second})
	kept := NewWorkflow("kept", func(ctx *Context, in int) (int, error) { return in, nil })
	short := NewWorkflow("fleeting", func(ctx *Context, in int) (int, error) { return in, nil }, WithRetention(time.Second))
	env.worker(WorkerConfig{}, kept, short)
	c := env.client()
	ctx := ctxT(t, 120*time.Second)
	var keptIDs []string
	for i := range 12 {
		id := fmt.Sprintf("kept-%02d", i)
		keptIDs = append(keptIDs, id)
		_, err := c.StartByName(ctx, "kept", json.RawMessage(`1`), WithRunID(id))
		require.NoError(t, err)
	}
	for _, id := range keptIDs {
		_, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		awaitIndexed(t, c, id, StatusCompleted)
	}

	// Churn: fleeting runs start (and complete, and expire a second later)
	// until the walks are done.
	defer churn(func(i int) bool {
		if _, err := c.StartByName(ctx, "fleeting", json.RawMessage(`1`), WithRunID(fmt.Sprintf("fleet-%04d", i))); err != nil && ctx.Err() == nil {
			t.Errorf("start fleet-%04d: %v", i, err)
			return false
		}
		return true
	})()

	expired := func() bool {
		_, err := c.GetRun(ctx, "fleet-0000")
		return errors.Is(err, ErrRunNotFound)
	}
	for walks := 0; walks < 3 || !expired(); walks++ {
		require.NoError(t, ctx.Err(), "no fleeting run expired")
		ids := runIDs(walkAll(t, c, ListOptions{Limit: 7}))
		var listedKept []string
		for _, id := range ids {
			if slices.Contains(keptIDs, id) {
				listedKept = append(listedKept, id)
			}
		}
		require.ElementsMatch(t, keptIDs, listedKept, "walk %d", walks)
		require.ElementsMatch(t, keptIDs, runIDs(walkAll(t, c, ListOptions{Workflow: "kept", Limit: 7})))
		counts, err := c.CountRuns(ctx, "kept")
		require.NoError(t, err)
		require.Equal(t, RunCounts{Completed: int64(len(keptIDs))}, counts)
	}
	// Expired runs leave the index: their entries expire with them, or the
	// listing that meets one removes it.
	require.NotContains(t, runIDs(walkAll(t, c, ListOptions{Workflow: "fleeting", Limit: 7})), "fleet-0000")
}

// TestRunIndexRepairsStaleEntries: an entry the index holds for a run in a
// state its record no longer has (a writer died between the record and
// the index), or for a run without a record, is not listed, and the
// listing that meets it repairs the index.
func TestRunIndexRepairsStaleEntries(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("repaired", func(ctx *Context, in int) (int, error) { return in, nil })
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	_, err := c.StartByName(ctx, "repaired", json.RawMessage(`1`), WithRunID("rep-1"))
	require.NoError(t, err)
	run, err := c.WaitRun(ctx, "rep-1")
	require.NoError(t, err)
	awaitIndexed(t, c, "rep-1", StatusCompleted)

	// A running entry left behind, and one for a run that has no record.
	stale := state.Run{RunID: "rep-1", Workflow: "repaired", Status: state.StatusRunning, CreatedAt: run.CreatedAt, UpdatedAt: run.CreatedAt}
	_, err = c.runs.Index().Put(ctx, stale, jetstream.TTLNever)
	require.NoError(t, err)
	ghost := state.Run{RunID: "rep-ghost", Workflow: "repaired", Status: state.StatusFailed, CreatedAt: run.CreatedAt, UpdatedAt: run.CreatedAt}
	_, err = c.runs.Index().Put(ctx, ghost, time.Hour)
	require.NoError(t, err)
	counts, err := c.CountRuns(ctx, "repaired")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Running: 1, Completed: 1, Failed: 1}, counts, "the index holds the stale entries")

	running, err := c.ListRuns(ctx, ListOptions{Status: StatusRunning})
	require.NoError(t, err)
	require.Empty(t, running.Runs, "a stale entry is not listed")
	all, err := c.ListRuns(ctx, ListOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"rep-1"}, runIDs(all.Runs))
	require.Equal(t, StatusCompleted, all.Runs[0].Status)

	counts, err = c.CountRuns(ctx, "repaired")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Completed: 1}, counts, "the listings repaired the index")
}

// A worker that admits a start (ClientConfig.StartByRequest) and is killed
// once the run's record is written: the run is listed as running at once.
// Its entry used to follow the record, so such a run was missing from
// every listing until a sweeper or a reader repaired the index
// (RepairGrace, 30 s), while GetRun found it.
func TestRunListedWhenItsAdmitterDiesAfterTheRecord(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	_, effectsURL := newEffectServer(t)
	ctx := ctxT(t, 30*time.Second)
	pc := admitterKilledAfterCreate(t, env, effectsURL)

	run, err := pc.GetRun(ctx, "crash-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)
	running, err := pc.ListRuns(ctx, ListOptions{Status: StatusRunning})
	require.NoError(t, err)
	require.Equal(t, []string{"crash-1"}, runIDs(running.Runs), "a run with a record is listed")
	counts, err := pc.CountRuns(ctx, "crashy")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Running: 1}, counts)
}
