package jetflow

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestListRunsPagesAndFilters lists runs of two workflows in pages with a
// cursor: every run appears exactly once, in run ID order, and the
// filters keep exactly the matching runs.
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

	var want []string
	for i := range 7 {
		id := fmt.Sprintf("list-%02d", i)
		want = append(want, id)
		wf := "listed"
		if i%3 == 0 {
			wf = "listed-fail"
		}
		_, err := c.StartByName(ctx, wf, json.RawMessage(`1`), WithRunID(id))
		require.NoError(t, err)
		_, err = c.WaitRun(ctx, id)
		require.NoError(t, err)
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

	for _, bad := range []ListOptions{{Limit: -1}, {Limit: MaxListLimit + 1}, {Status: "done"}, {Workflow: "a.b"}, {After: "a b"}} {
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
