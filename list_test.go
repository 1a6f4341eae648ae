package jetflow

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestListRunsPagesAndFilters lists runs of two workflows in pages with a
// cursor: every run appears exactly once, newest first, and the filters
// (status, workflow, run ID prefix, time) keep exactly the matching runs.
func TestListRunsPagesAndFilters(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ok := threeSteps("listed", newCounter())
	failing := NewWorkflow("listed-fail", func(ctx *Context, in int) (int, error) {
		return 0, Fatal(fmt.Errorf("no"))
	})
	env.worker(WorkerConfig{}, ok, failing)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	page, err := c.ListRuns(ctx, ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "an empty bucket lists nothing")
	require.Empty(t, page.Next)

	var want []string // newest first
	var ended []time.Time
	for i := range 7 {
		id := fmt.Sprintf("list-%02d", i)
		want = append([]string{id}, want...)
		wf := "listed"
		if i%3 == 0 {
			wf = "listed-fail"
		}
		_, err := c.StartByName(ctx, wf, json.RawMessage(`1`), WithRunID(id))
		require.NoError(t, err)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		ended = append(ended, run.UpdatedAt)
		awaitIndexed(t, c, id, run.Status)
	}

	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "paging must end")
		page, err := c.ListRuns(ctx, ListOptions{After: cursor, Limit: 3})
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Runs), 3)
		for _, r := range page.Runs {
			got = append(got, r.RunID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	require.Equal(t, want, got)

	failed, err := c.ListRuns(ctx, ListOptions{Status: StatusFailed})
	require.NoError(t, err)
	require.Len(t, failed.Runs, 3)
	for _, r := range failed.Runs {
		require.Equal(t, "listed-fail", r.Workflow)
		require.Equal(t, StatusFailed, r.Status)
	}
	byWorkflow, err := c.ListRuns(ctx, ListOptions{Workflow: "listed", Status: StatusCompleted})
	require.NoError(t, err)
	require.Len(t, byWorkflow.Runs, 4)

	byPrefix, err := c.ListRuns(ctx, ListOptions{RunIDPrefix: "list-0"})
	require.NoError(t, err)
	require.Len(t, byPrefix.Runs, 7)
	exact, err := c.ListRuns(ctx, ListOptions{RunIDPrefix: "list-03"})
	require.NoError(t, err)
	require.Equal(t, []string{"list-03"}, runIDs(exact.Runs))
	none, err := c.ListRuns(ctx, ListOptions{RunIDPrefix: "list-030"})
	require.NoError(t, err)
	require.Empty(t, none.Runs)

	// Runs 2..4 ended in [ended[2], ended[5]): the index entry of each is
	// written after its record, and before the next run started.
	window, err := c.ListRuns(ctx, ListOptions{Since: ended[2], Until: ended[5]})
	require.NoError(t, err)
	require.Equal(t, []string{"list-04", "list-03", "list-02"}, runIDs(window.Runs))

	counts, err := c.CountRuns(ctx, "")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Completed: 4, Failed: 3}, counts)
	counts, err = c.CountRuns(ctx, "listed-fail")
	require.NoError(t, err)
	require.Equal(t, RunCounts{Failed: 3}, counts)

	now := time.Now()
	for _, bad := range []ListOptions{{Limit: -1}, {Limit: MaxListLimit + 1}, {Status: "done"}, {Workflow: "a.b"}, {After: "a b"}, {After: "c0"},
		{RunIDPrefix: "a.b"}, {RunIDPrefix: "a*"}, {Since: now, Until: now}} {
		_, err := c.ListRuns(ctx, bad)
		require.ErrorIs(t, err, ErrInvalidListOptions, "%+v", bad)
	}
}

// TestRequireRunID: a workflow that requires a run ID refuses a start
// without one, from Go and over NATS, and stores nothing; with one it
// starts as usual.
func TestRequireRunID(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("keyed-only", func(ctx *Context, in int) (int, error) { return in, nil }, RequireRunID())
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	_, err := Start(ctx, c, wf, 1)
	require.ErrorIs(t, err, ErrRunIDRequired)
	_, err = c.StartByName(ctx, "keyed-only", json.RawMessage(`1`))
	require.ErrorIs(t, err, ErrRunIDRequired)
	page, err := c.ListRuns(ctx, ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "a refused start stores nothing")

	h, err := Start(ctx, c, wf, 2, WithRunID("keyed-1"))
	require.NoError(t, err)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, out)
	res, err := c.StartByName(ctx, "keyed-only", json.RawMessage(`2`), WithRunID("keyed-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, res.Outcome)
}

// awaitIndexed waits until the run index lists runID in status: its entry
// is written just after the record, so a run WaitRun saw end may not be
// listed yet.
func awaitIndexed(t *testing.T, c *Client, runID string, status RunStatus) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	for {
		page, err := c.ListRuns(ctx, ListOptions{RunIDPrefix: runID, Status: status})
		require.NoError(t, err)
		if slices.Contains(runIDs(page.Runs), runID) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s never listed as %s", runID, status)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
