package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// listBackend records the ListRuns options and CountRuns workflows it is
// asked for, and answers counts with fixed numbers.
type listBackend struct {
	fakeBackend
	mu        sync.Mutex
	lists     []jetflow.ListOptions
	workflows []string
}

func (l *listBackend) ListRuns(_ context.Context, opts jetflow.ListOptions) (jetflow.RunPage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lists = append(l.lists, opts)
	return jetflow.RunPage{}, nil
}

func (l *listBackend) CountRuns(_ context.Context, workflow string) (jetflow.RunCounts, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.workflows = append(l.workflows, workflow)
	return jetflow.RunCounts{Running: 1, Blocked: 5, Completed: 2, Failed: 3, Cancelled: 4}, nil
}

// Each bad list parameter gets a 400 problem that names it, and nothing
// is asked of the backend; good ones reach ListRuns as options.
func TestListRunsParameters(t *testing.T) {
	t.Parallel()
	be := &listBackend{}
	s, err := New(Config{Backend: be})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	for _, tc := range []struct{ query, names string }{
		{"status=sleeping", "status"},
		{"workflow=" + url.QueryEscape("bad name"), "workflow"},
		{"prefix=" + url.QueryEscape("a.b"), "prefix"},
		{"since=yesterday", "since"},
		{"until=2026-01-02", "until"},
		{"since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "since"},
		{"since=2026-01-02T00:00:00Z&until=2026-01-02T00:00:00Z", "since"},
		{"limit=0", "limit"},
		{"limit=501", "limit"},
		{"limit=ten", "limit"},
	} {
		res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs?"+tc.query, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, "%s: %s", tc.query, res.body)
		require.Contains(t, res.problem(t).Detail, tc.names+" ", tc.query)
	}
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/counts?workflow=bad%20name", nil, "")
	require.Equal(t, http.StatusNotFound, res.code, "no such route")
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs/counts?workflow=bad%20name", nil, "")
	require.Equal(t, http.StatusBadRequest, res.code)
	require.Contains(t, res.problem(t).Detail, "workflow ")
	be.mu.Lock()
	require.Empty(t, be.lists)
	require.Empty(t, be.workflows)
	be.mu.Unlock()

	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet,
		"/v1/runs?workflow=order&status=failed&prefix=order-&since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00.5%2B01:00&cursor=c1&limit=7", nil, "")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	require.JSONEq(t, `{"runs":[]}`, string(res.body))
	be.mu.Lock()
	defer be.mu.Unlock()
	require.Equal(t, []jetflow.ListOptions{{Workflow: "order", Status: jetflow.StatusFailed, RunIDPrefix: "order-",
		Since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Until: time.Date(2026, 1, 2, 0, 0, 0, 5e8, time.FixedZone("", 3600)),
		After: "c1", Limit: 7}}, be.lists)
}

// /v1/runs/counts is its own route, not a run named "counts": the literal
// segment wins over {id} in ServeMux, and a run ID is still read.
func TestCountsRoute(t *testing.T) {
	t.Parallel()
	be := &listBackend{}
	s, err := New(Config{Backend: be})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs/counts?workflow=order", nil, "")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	require.JSONEq(t, `{"running":1,"blocked":5,"completed":2,"failed":3,"cancelled":4}`, string(res.body))
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs/counts", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs/countsx", nil, "")
	require.Equal(t, http.StatusNotFound, res.code, "a run ID: the fake has no runs")
	require.Equal(t, "countsx", res.problem(t).RunID)
	be.mu.Lock()
	defer be.mu.Unlock()
	require.Equal(t, []string{"order", ""}, be.workflows)
}

// Against a real server: a step that failed twice and then committed
// shows its two failed attempts and when the committed one started; a
// step that failed twice and runs its third attempt is open, with its
// failed attempts; the lists are never null.
func TestGetRunTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("flaky", "tl-1", `"card"`).code)
	b.waitDone("tl-1")
	var run jetflow.RunDescription
	res := b.do(http.MethodGet, "/v1/runs/tl-1", nil, "")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	res.json(t, &run)
	require.Contains(t, string(res.body), `"open_steps":[]`)
	require.Len(t, run.Steps, 1)
	step := run.Steps[0]
	require.Equal(t, "tl-1.charge.0", step.StepID)
	require.Equal(t, 3, step.Attempt)
	require.False(t, step.StartedAt.IsZero())
	require.False(t, step.StartedAt.After(step.CommittedAt))
	require.Len(t, step.Attempts, 2)
	for i, a := range step.Attempts {
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, "declined: card", a.Error)
		require.False(t, a.EndedAt.Before(a.StartedAt))
		require.False(t, a.EndedAt.After(step.StartedAt))
	}

	require.Equal(t, http.StatusCreated, b.post("flaky", "tl-2", `"hold"`).code)
	require.Eventually(t, func() bool {
		res := b.do(http.MethodGet, "/v1/runs/tl-2", nil, "")
		var run jetflow.RunDescription
		res.json(t, &run)
		return len(run.OpenSteps) == 1 && run.OpenSteps[0].Attempt == 3
	}, 30*time.Second, 20*time.Millisecond, "the step blocked in its third attempt is listed as open")
	res = b.do(http.MethodGet, "/v1/runs/tl-2", nil, "")
	res.json(t, &run)
	require.Len(t, run.Steps, 1, "prepare")
	open := run.OpenSteps[0]
	require.Equal(t, "tl-2.charge.0", open.StepID)
	require.Equal(t, "charge", open.Name)
	require.Len(t, open.Attempts, 2)
	require.Equal(t, "declined: hold", open.Attempts[1].Error)
	b.release()
	b.waitDone("tl-2")
}

// Against a real server: filters by workflow, status and run ID prefix,
// a time window, pages newest first that join up without repeats, and
// the counts.
func TestListRunsFiltersAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	begin := time.Now().UTC()
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("lp-a-%d", i)
		require.Equal(t, http.StatusCreated, b.post("echo", id, `{"n":1}`).code)
		b.waitDone(id) // one at a time: each ends after the one before
		ids = append(ids, id)
	}
	require.Equal(t, http.StatusCreated, b.post("fails", "lp-b-1", `{}`).code)
	b.waitDone("lp-b-1")

	b.waitListed("prefix=lp-", []string{"lp-b-1", "lp-a-4", "lp-a-3", "lp-a-2", "lp-a-1", "lp-a-0"})
	list := func(query string) jetflow.RunPage {
		t.Helper()
		res := b.do(http.MethodGet, "/v1/runs?"+query, nil, "")
		require.Equal(t, http.StatusOK, res.code, "%s: %s", query, res.body)
		var page jetflow.RunPage
		res.json(t, &page)
		return page
	}
	runIDs := func(p jetflow.RunPage) []string {
		var out []string
		for _, r := range p.Runs {
			out = append(out, r.RunID)
		}
		return out
	}

	var walked []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3)
		p := list("prefix=lp-a-&limit=2&cursor=" + url.QueryEscape(cursor))
		require.LessOrEqual(t, len(p.Runs), 2)
		walked = append(walked, runIDs(p)...)
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	require.Equal(t, []string{"lp-a-4", "lp-a-3", "lp-a-2", "lp-a-1", "lp-a-0"}, walked, "newest first, each once")

	require.Equal(t, []string{"lp-b-1"}, runIDs(list("status=failed")))
	require.Equal(t, []string{"lp-b-1"}, runIDs(list("workflow=fails")))
	require.Empty(t, runIDs(list("workflow=echo&status=failed")))
	require.Len(t, list("since="+begin.Format(time.RFC3339Nano)).Runs, 6)
	require.Empty(t, list("until="+begin.Format(time.RFC3339Nano)).Runs)
	require.Empty(t, list("since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)).Runs)

	res := b.do(http.MethodGet, "/v1/runs/counts", nil, "")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	require.JSONEq(t, `{"running":0,"blocked":0,"completed":5,"failed":1,"cancelled":0}`, string(res.body))
	res = b.do(http.MethodGet, "/v1/runs/counts?workflow=fails", nil, "")
	require.JSONEq(t, `{"running":0,"blocked":0,"completed":0,"failed":1,"cancelled":0}`, string(res.body))

	res = b.do(http.MethodGet, "/v1/runs?cursor="+url.QueryEscape("not a cursor!"), nil, "")
	require.Equal(t, http.StatusBadRequest, res.code, "%s", res.body)
	require.True(t, strings.Contains(res.problem(t).Detail, "cursor"))
}

// waitListed waits until GET /v1/runs?query lists exactly want, in this
// order: the run index is written after each run record, so a listing
// right after a run ended can miss its last change for a moment.
func (b *bundle) waitListed(query string, want []string) {
	b.t.Helper()
	list := func() []string {
		res := b.do(http.MethodGet, "/v1/runs?"+query, nil, "")
		var page jetflow.RunPage
		res.json(b.t, &page)
		var got []string
		for _, r := range page.Runs {
			got = append(got, r.RunID)
		}
		return got
	}
	if !assert.Eventually(b.t, func() bool { return slices.Equal(want, list()) }, 10*time.Second, 10*time.Millisecond) {
		require.Equal(b.t, want, list(), query)
	}
}
