package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// GET /v1/runs/{id}: the run with its steps and duplicate audit.
func TestGetRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("echo", "get-1", `{"n":5}`).code)
	require.Equal(t, http.StatusCreated, b.post("echo", "get-1", `{"n":5}`).code)
	b.waitDone("get-1")

	res := b.do(http.MethodGet, "/v1/runs/get-1", nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
	require.Equal(t, "completed", res.header.Get(HeaderRunStatus))
	var run jetflow.RunDescription
	res.json(t, &run)
	require.Equal(t, "get-1", run.RunID)
	require.Equal(t, "echo", run.Workflow)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `{"n":5}`, string(run.Input))
	require.JSONEq(t, `10`, string(run.Output))
	require.Nil(t, run.Error)
	require.EqualValues(t, 1, run.Duplicates)
	require.NotNil(t, run.FirstDuplicate)
	require.Equal(t, "existing", run.FirstDuplicate.Outcome)
	require.True(t, run.FirstDuplicate.FingerprintMatch)
	require.Equal(t, "http", run.FirstDuplicate.Source)
	require.Len(t, run.Steps, 1)
	require.Equal(t, "get-1.double.0", run.Steps[0].StepID)
	require.JSONEq(t, `10`, string(run.Steps[0].Output))

	// A run with no committed step still lists "steps": [].
	res = b.post("fails", "get-2", `{}`)
	require.Equal(t, http.StatusCreated, res.code)
	b.waitDone("get-2")
	res = b.do(http.MethodGet, "/v1/runs/get-2", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	require.Contains(t, string(res.body), `"steps":[]`)

	res = b.do(http.MethodGet, "/v1/runs/missing-1", nil, "")
	require.Equal(t, http.StatusNotFound, res.code)
	require.Equal(t, "missing-1", res.problem(t).RunID)

	res = b.do(http.MethodGet, "/v1/runs/bad%20id", nil, "")
	require.Equal(t, http.StatusBadRequest, res.code)
	res.problem(t)
}

// GET /v1/runs/{id}/result: 202 with Retry-After while running (at once,
// or after the wait), 200 once ended, whether completed or failed.
func TestResultLongPoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("echo", "poll-1", `{"n":3,"block":true}`).code)

	for _, q := range []string{"", "?wait=0", "?wait=50ms", "?wait=1"} {
		begin := time.Now()
		res := b.do(http.MethodGet, "/v1/runs/poll-1/result"+q, nil, "")
		require.Equal(t, http.StatusAccepted, res.code, "query %q: %s", q, res.body)
		require.Equal(t, "1", res.header.Get("Retry-After"))
		require.Equal(t, "running", res.header.Get(HeaderRunStatus))
		var run jetflow.Run
		res.json(t, &run)
		require.Equal(t, jetflow.StatusRunning, run.Status)
		if q == "?wait=1" {
			require.GreaterOrEqual(t, time.Since(begin), time.Second, "waited the whole second")
		}
	}

	// A long poll in flight when the run ends answers 200 at once.
	done := make(chan response, 1)
	go func() {
		done <- doCtx(t, ctxT(t, 30*time.Second), b.srv, http.MethodGet, "/v1/runs/poll-1/result?wait=30s", nil, "")
	}()
	b.release()
	var res response
	select {
	case res = <-done:
	case <-time.After(25 * time.Second):
		t.Fatal("the long poll did not end with the run")
	}
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	var run jetflow.Run
	res.json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `6`, string(run.Output))

	// A failed run is a final answer too; the body says failed.
	require.Equal(t, http.StatusCreated, b.post("fails", "poll-2", `{}`).code)
	res = b.waitDone("poll-2")
	res.json(t, &run)
	require.Equal(t, jetflow.StatusFailed, run.Status)
	require.NotNil(t, run.Error)
	require.Contains(t, run.Error.Message, "it failed")

	for _, q := range []string{"?wait=abc", "?wait=61s", "?wait=-1s", "?wait=2m"} {
		res := b.do(http.MethodGet, "/v1/runs/poll-1/result"+q, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, q)
		res.problem(t)
	}
	res = b.do(http.MethodGet, "/v1/runs/nope-1/result?wait=5s", nil, "")
	require.Equal(t, http.StatusNotFound, res.code)
	res.problem(t)
}

// waitSignal is a Backend that says when a WaitRun begins.
type waitSignal struct {
	Backend
	waiting chan struct{}
}

func (w *waitSignal) WaitRun(ctx context.Context, runID string) (jetflow.Run, error) {
	w.waiting <- struct{}{}
	return w.Backend.WaitRun(ctx, runID)
}

// A long poll stops when its client goes away.
func TestResultWaitStopsWhenClientLeaves(t *testing.T) {
	t.Parallel()
	waiting := make(chan struct{}, 1)
	b := setup(t, func(c *Config) { c.Backend = &waitSignal{Backend: c.Backend, waiting: waiting} })
	require.Equal(t, http.StatusCreated, b.post("echo", "leave-1", `{"n":1,"block":true}`).code)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.srv.URL+"/v1/runs/leave-1/result?wait=60s", nil)
		if err == nil {
			var res *http.Response
			if res, err = contractClient(t, b.srv).Do(req); err == nil {
				res.Body.Close()
			}
		}
		errc <- err
	}()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not start waiting")
	}
	cancel()
	require.Error(t, <-errc)

	deadline := time.After(10 * time.Second) // far below the 60s wait
	for {
		select {
		case o := <-b.observedCh:
			if o.route == "GET /v1/runs/{id}/result" {
				require.Equal(t, statusClientClosed, o.code)
				return
			}
		case <-deadline:
			t.Fatal("the handler kept waiting after the client left")
		}
	}
}

// GET /v1/runs pages through runs with a cursor, newest first.
func TestListRunsPaging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []string
	for i := range 5 {
		id := fmt.Sprintf("list-%d", i)
		want = append([]string{id}, want...)
		require.Equal(t, http.StatusCreated, b.post("echo", id, fmt.Sprintf(`{"n":%d}`, i)).code)
		b.waitDone(id) // each ends after the one before: a fixed order
	}
	require.Equal(t, http.StatusCreated, b.post("fails", "other-1", `{}`).code)
	b.waitListed("workflow=echo&limit=500", want)

	var got []string
	cursor, pages := "", 0
	for {
		res := b.do(http.MethodGet, "/v1/runs?workflow=echo&limit=2&cursor="+url.QueryEscape(cursor), nil, "")
		require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
		var page jetflow.RunPage
		res.json(t, &page)
		pages++
		require.LessOrEqual(t, len(page.Runs), 2)
		for _, r := range page.Runs {
			require.Equal(t, "echo", r.Workflow)
			got = append(got, r.RunID)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
		require.Less(t, pages, 10)
	}
	require.Equal(t, want, got)
	require.GreaterOrEqual(t, pages, 3)

	b.waitDone("other-1")
	res := b.do(http.MethodGet, "/v1/runs?status=failed", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	var page jetflow.RunPage
	res.json(t, &page)
	require.Len(t, page.Runs, 1)
	require.Equal(t, "other-1", page.Runs[0].RunID)

	res = b.do(http.MethodGet, "/v1/runs?workflow=nothing", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	require.JSONEq(t, `{"runs":[]}`, string(res.body))

	for _, q := range []string{"status=done", "limit=0", "limit=501", "limit=x", "cursor=bad%20cursor", "workflow=a.b"} {
		res := b.do(http.MethodGet, "/v1/runs?"+q, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, q)
		res.problem(t)
	}
}

// A NATS read that does not finish within the request timeout is 503 with
// Retry-After: try again.
func TestReadTimeoutIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = time.Nanosecond })
	res := b.do(http.MethodGet, "/v1/runs/any-1", nil, "")
	require.Equal(t, http.StatusServiceUnavailable, res.code, "body: %s", res.body)
	require.Equal(t, "1", res.header.Get("Retry-After"))
	res.problem(t)
}

// A long poll in flight when the server begins to stop answers at once
// with the run as it is (202), instead of holding the shutdown for its
// whole wait.
func TestResultWaitEndsWhenServerStops(t *testing.T) {
	t.Parallel()
	stopping, stop := context.WithCancel(context.Background())
	defer stop()
	waiting := make(chan struct{}, 1)
	b := setup(t, func(c *Config) {
		c.Stopping = stopping
		c.Backend = &waitSignal{Backend: c.Backend, waiting: waiting}
	})
	require.Equal(t, http.StatusCreated, b.post("echo", "stop-1", `{"n":1,"block":true}`).code)

	done := make(chan response, 1)
	go func() {
		done <- doCtx(t, ctxT(t, 30*time.Second), b.srv, http.MethodGet, "/v1/runs/stop-1/result?wait=60s", nil, "")
	}()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not start waiting")
	}
	stop()
	select {
	case res := <-done:
		require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)
		require.Equal(t, "running", res.header.Get(HeaderRunStatus))
	case <-time.After(10 * time.Second): // far below the 60s wait
		t.Fatal("the long poll kept waiting after the server began to stop")
	}
}

// The bodies built around the public records (jetflow.RunDescription, RunList):
// "steps", "open_steps", "waits" and "runs" are lists, empty rather than absent or
// null, and a run's steps follow its fields, then its open steps and its open waits. (These were internal/view's tests; the
// records' own encodings are tested in the root package, json_test.go.)
func TestRunBodiesJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	run := jetflow.Run{RunID: "order-1", Workflow: "ship", Status: jetflow.StatusRunning, CreatedAt: at, UpdatedAt: at}
	encode := func(v any) string {
		rec := httptest.NewRecorder()
		writeJSON(rec, http.StatusOK, "application/json", v)
		return rec.Body.String()
	}
	require.Equal(t, `{"run_id":"order-1","workflow":"ship","status":"running","created_at":"2025-01-02T03:04:05Z",`+
		`"updated_at":"2025-01-02T03:04:05Z","generation":0,"duplicates":0,"steps":[],"open_steps":[],"waits":[]}`+"\n",
		encode(jetflow.RunDescription{Run: run}), "asked for and none: an empty list")

	steps := []jetflow.StepRecord{{StepID: "order-1.pack.0", Name: "pack", Attempt: 2, Output: json.RawMessage(`3`), Worker: "w1", CommittedAt: at}}
	open := []jetflow.OpenStep{{StepID: "order-1.ship.0", Name: "ship", Attempt: 1}}
	waits := []jetflow.OpenWait{{StepID: "order-1.event=paid.0", Name: "event=paid", Kind: "event", Event: "paid", Since: at, Until: at.Add(time.Hour)}}
	desc := jetflow.RunDescription{Run: run, Steps: steps, OpenSteps: open, Waits: waits}
	b := encode(desc)
	require.True(t, strings.HasSuffix(b, `"duplicates":0,"steps":[{"step_id":"order-1.pack.0","name":"pack","attempt":2,"output":3,"worker":"w1","committed_at":"2025-01-02T03:04:05Z"}],`+
		`"open_steps":[{"step_id":"order-1.ship.0","name":"ship","attempt":1}],`+
		`"waits":[{"step_id":"order-1.event=paid.0","name":"event=paid","kind":"event","event":"paid","since":"2025-01-02T03:04:05Z","until":"2025-01-02T04:04:05Z"}]}`+"\n"), b)
	var back jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(b), &back))
	require.Equal(t, desc, back)

	require.Equal(t, `{"runs":[]}`+"\n", encode(RunList(jetflow.RunPage{})))
	var page jetflow.RunPage
	require.NoError(t, json.Unmarshal([]byte(encode(RunList(jetflow.RunPage{Runs: []jetflow.Run{run}, Next: "order-1"}))), &page))
	require.Equal(t, "order-1", page.Next)
	require.Len(t, page.Runs, 1)
}
