package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// cancel sends POST /v1/runs/{id}/cancel with header.
func (b *bundle) cancel(runID string, header http.Header) response {
	b.t.Helper()
	return b.do(http.MethodPost, "/v1/runs/"+runID+"/cancel", header, "")
}

// cancelled decodes a 200 answer to a cancel.
func (r response) cancelled(t *testing.T) Cancelled {
	t.Helper()
	require.Equal(t, http.StatusOK, r.code, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.Equal(t, "cancelled", r.header.Get(HeaderRunStatus))
	var c Cancelled
	r.json(t, &c)
	return c
}

// A running run is cancelled by the first request (200), and a repeat
// answers 200 with already_cancelled; the run's result then says
// cancelled (error kind cancelled).
func TestCancelRunningRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("echo", "cancel-1", `{"n":1,"block":true}`).code)
	res := b.do(http.MethodGet, "/v1/runs/cancel-1", nil, "")
	require.Equal(t, "running", res.header.Get(HeaderRunStatus), "body: %s", res.body)

	res = b.cancel("cancel-1", nil)
	require.Equal(t, Cancelled{RunID: "cancel-1", Status: jetflow.StatusCancelled, Children: []string{}}, res.cancelled(t))
	require.Contains(t, string(res.body), `"children":[]`, "no children is [], never null")

	res = b.cancel("cancel-1", nil)
	require.Equal(t, Cancelled{RunID: "cancel-1", Status: jetflow.StatusCancelled, AlreadyCancelled: true, Children: []string{}}, res.cancelled(t))

	res = b.waitDone("cancel-1")
	require.Equal(t, "cancelled", res.header.Get(HeaderRunStatus))
	var run jetflow.Run
	res.json(t, &run)
	require.Equal(t, jetflow.StatusCancelled, run.Status)
	require.NotNil(t, run.Error)
	require.Equal(t, "cancelled", string(run.Error.Kind))
}

// A cancel of a run that completed or failed is 409 with the state it
// ended in, and changes nothing; an unknown run is 404, an invalid run ID
// 400, without a token 401.
func TestCancelRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Tokens = []string{"tok"} })
	auth := http.Header{"Authorization": {"Bearer tok"}}
	post := func(workflow, key, input string) {
		t.Helper()
		h := http.Header{"Content-Type": {"application/json"}, HeaderIdempotencyKey: {key}, "Authorization": {"Bearer tok"}}
		res := b.do(http.MethodPost, "/v1/workflows/"+workflow+"/runs", h, input)
		require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
		res = b.do(http.MethodGet, "/v1/runs/"+key+"/result?wait=20s", auth, "")
		require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	}
	post("echo", "done-1", `{"n":2}`)
	post("fails", "failed-1", `{}`)

	for id, status := range map[string]string{"done-1": "completed", "failed-1": "failed"} {
		res := b.cancel(id, auth)
		require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
		require.Equal(t, status, res.header.Get(HeaderRunStatus))
		p := res.problem(t)
		require.Equal(t, RunEndedType, p.Type)
		require.Equal(t, id, p.RunID)
		require.Contains(t, p.Detail, status)
		var ended struct {
			RunStatus string `json:"run_status"`
		}
		res.json(t, &ended)
		require.Equal(t, status, ended.RunStatus)

		res = b.do(http.MethodGet, "/v1/runs/"+id, auth, "")
		require.Equal(t, status, res.header.Get(HeaderRunStatus), "the refused cancel changed nothing")
	}

	res := b.cancel("missing-1", auth)
	require.Equal(t, http.StatusNotFound, res.code, "body: %s", res.body)
	require.Equal(t, "missing-1", res.problem(t).RunID)

	for _, bad := range []string{"bad.id", "bad%20id", strings.Repeat("x", 129)} {
		res = b.cancel(bad, auth)
		require.Equal(t, http.StatusBadRequest, res.code, "%s: %s", bad, res.body)
		require.Contains(t, res.problem(t).Detail, "run ID")
	}

	res = b.cancel("done-1", nil)
	require.Equal(t, http.StatusUnauthorized, res.code)
	res.problem(t)
	res = b.cancel("done-1", http.Header{"Authorization": {"Bearer other"}})
	require.Equal(t, http.StatusUnauthorized, res.code)
}

// With NATS down a cancel is 503 with Retry-After, never a 500, and
// cancels nothing; once NATS is back the retried cancel cancels the run.
func TestCancelNATSOutageIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = 2 * time.Second })
	require.Equal(t, http.StatusCreated, b.post("echo", "out-c-1", `{"n":1,"block":true}`).code)

	b.ns.Shutdown()
	res := b.cancel("out-c-1", nil)
	require.Equal(t, http.StatusServiceUnavailable, res.code, "body: %s", res.body)
	require.Equal(t, "1", res.header.Get("Retry-After"))
	require.Equal(t, "out-c-1", res.problem(t).RunID)

	require.NoError(t, b.ns.Restart())
	var last response
	require.Eventually(t, func() bool { // until the client has reconnected
		last = b.do(http.MethodGet, "/v1/runs/out-c-1", nil, "")
		return last.code != http.StatusServiceUnavailable
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, "running", last.header.Get(HeaderRunStatus), "the cancel refused during the outage changed nothing: %s", last.body)
	res = b.cancel("out-c-1", nil)
	require.Equal(t, Cancelled{RunID: "out-c-1", Status: jetflow.StatusCancelled, Children: []string{}}, res.cancelled(t))

	// The worker is back too (a run starts and completes), so that it
	// stops cleanly when the test ends.
	require.Eventually(t, func() bool {
		return b.post("echo", "out-c-2", `{"n":2}`).code == http.StatusCreated
	}, 30*time.Second, 20*time.Millisecond)
	b.waitDone("out-c-2")
}

// cancelBackend answers every cancel with out and err.
type cancelBackend struct {
	fakeBackend
	out jetflow.CancelOutcome
	err error
}

func (c *cancelBackend) CancelRun(_ context.Context, runID string) (jetflow.CancelOutcome, error) {
	c.out.RunID = runID
	return c.out, c.err
}

// The children a cancel took along are listed; a backend's errors map
// to their statuses as on every route, a NATS failure after the record was
// cancelled (telling workers or the parent) included: 503, to be retried; a
// write the server's NATS user may not make is 403.
func TestCancelAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		be   *cancelBackend
		code int
		body string
	}{
		{"children", &cancelBackend{out: jetflow.CancelOutcome{Status: jetflow.StatusCancelled, Children: []string{"r-1-c1", "r-1-c1-g"}}},
			200, `{"run_id":"r-1","status":"cancelled","already_cancelled":false,"children":["r-1-c1","r-1-c1-g"]}`},
		{"repeat", &cancelBackend{out: jetflow.CancelOutcome{Status: jetflow.StatusCancelled, AlreadyCancelled: true}},
			200, `{"run_id":"r-1","status":"cancelled","already_cancelled":true,"children":[]}`},
		{"notify failed", &cancelBackend{out: jetflow.CancelOutcome{Status: jetflow.StatusCancelled},
			err: fmt.Errorf("jetflow: run r-1 cancelled, but notifying workers failed: %w", jetflow.ErrUnavailable)}, 503, ""},
		{"unknown", &cancelBackend{err: jetflow.ErrRunNotFound}, 404, ""},
		{"denied", &cancelBackend{err: fmt.Errorf("%w: the NATS server refused a publish to $KV.jetflow_runs.r-1", jetflow.ErrPermissionDenied)}, 403, ""},
		{"bug", &cancelBackend{err: fmt.Errorf("boom")}, 500, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{Backend: tc.be})
			require.NoError(t, err)
			res := doCtx(t, ctxT(t, 10*time.Second), newTestServer(t, s), http.MethodPost, "/v1/runs/r-1/cancel", nil, "")
			require.Equal(t, tc.code, res.code, "body: %s", res.body)
			if tc.body != "" {
				require.JSONEq(t, tc.body, string(res.body))
				return
			}
			p := res.problem(t)
			require.Equal(t, "r-1", p.RunID)
			require.Equal(t, "about:blank", p.Type)
		})
	}
}

// The run-ended problem type points at a section that exists in
// docs/http.md.
func TestRunEndedDocsAnchorExists(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/http.md")
	require.NoError(t, err)
	require.Equal(t, "cancelling-a-run", strings.TrimPrefix(RunEndedType, DocsURL+"#"))
	require.Contains(t, string(doc), "\n## Cancelling a run\n", "GitHub derives the anchor from this heading")
}
