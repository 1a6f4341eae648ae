package httpapi

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// A new run is 201 with Location and links; a repeat of the request (the
// same key, the same input as JSON, the key bare or quoted) gets the same
// status and body, with Idempotent-Replayed.
func TestStartCreatedThenReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first := b.post("echo", "order-1", `{"n":2}`)
	require.Equal(t, http.StatusCreated, first.code, "body: %s", first.body)
	require.Equal(t, "/v1/runs/order-1", first.header.Get("Location"))
	require.Equal(t, "created", first.header.Get(HeaderOutcome))
	require.Contains(t, []string{"running", "completed"}, first.header.Get(HeaderRunStatus))
	require.Empty(t, first.header.Values(HeaderReplayed))
	var started Started
	first.json(t, &started)
	require.Equal(t, Started{RunID: "order-1", Workflow: "echo",
		Links: RunLinks{Run: "/v1/runs/order-1", Result: "/v1/runs/order-1/result"}}, started)

	for _, repeat := range []struct{ key, input string }{
		{"order-1", `{"n":2}`},
		{`"order-1"`, `{ "n" : 2 }`},
		{` order-1 `, "{\n\"n\": 2}"},
	} {
		again := b.post("echo", repeat.key, repeat.input)
		require.Equal(t, first.code, again.code, "body: %s", again.body)
		require.Equal(t, first.body, again.body, "a replay sends the identical body")
		require.Equal(t, "true", again.header.Get(HeaderReplayed))
		require.Equal(t, "existing", again.header.Get(HeaderOutcome))
		require.Equal(t, "/v1/runs/order-1", again.header.Get("Location"))
		require.NotEmpty(t, again.header.Get(HeaderRunStatus))
	}

	var run struct {
		Status     string `json:"status"`
		Output     int    `json:"output"`
		Duplicates int    `json:"duplicates"`
		Source     string `json:"source"`
	}
	b.waitDone("order-1").json(t, &run)
	require.Equal(t, "completed", run.Status)
	require.Equal(t, 4, run.Output)
	require.Equal(t, 3, run.Duplicates)
	require.Equal(t, "http", run.Source)
}

// Without a key a start is refused, every time, and stores nothing: a
// client whose key variable is unset must not start a run per retry. A
// generated ID is asked for with ?generate_run_id=true, and then each
// request creates its own run.
func TestStartWithoutKeyIsRefusedUnlessGenerationIsAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 {
		res := b.do(http.MethodPost, "/v1/workflows/echo/runs", nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
		p := res.problem(t)
		require.Equal(t, RunIDRequiredType, p.Type)
		require.Contains(t, p.Detail, "generate_run_id=true")
		// A header with an empty value is an invalid key.
		res = b.do(http.MethodPost, "/v1/workflows/echo/runs", http.Header{HeaderIdempotencyKey: {""}}, "")
		require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	}
	for _, bad := range []string{"?generate_run_id=maybe", "?generate_run_id=false"} {
		res := b.do(http.MethodPost, "/v1/workflows/echo/runs"+bad, nil, "")
		require.Equal(t, http.StatusBadRequest, res.code, "%s: %s", bad, res.body)
	}
	res := b.do(http.MethodPost, "/v1/workflows/echo/runs?generate_run_id=true", http.Header{HeaderIdempotencyKey: {"both-1"}}, "")
	require.Equal(t, http.StatusBadRequest, res.code, "key and generate_run_id: %s", res.body)
	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "a refused start stores nothing")

	ids := make(map[string]bool)
	for range 2 {
		res := b.do(http.MethodPost, "/v1/workflows/echo/runs?generate_run_id=true", nil, "") // no content type, no body: null
		require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
		require.Equal(t, "created", res.header.Get(HeaderOutcome))
		var s Started
		res.json(t, &s)
		require.NotEmpty(t, s.RunID)
		require.Equal(t, "/v1/runs/"+s.RunID, res.header.Get("Location"))
		ids[s.RunID] = true
	}
	require.Len(t, ids, 2)
}

// 20 concurrent requests with one key: one run, one created answer, 19
// replays, all naming the same run.
func TestStartConcurrentSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = doCtx(t, ctxT(t, 30*time.Second), b.srv, http.MethodPost, "/v1/workflows/echo/runs",
				http.Header{HeaderIdempotencyKey: {"race-1"}, "Content-Type": {"application/json"}}, `{"n":7}`)
		}()
	}
	wg.Wait()
	created, replayed := 0, 0
	for _, res := range results {
		require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
		require.Equal(t, results[0].body, res.body)
		var s Started
		res.json(t, &s)
		require.Equal(t, "race-1", s.RunID)
		switch res.header.Get(HeaderOutcome) {
		case "created":
			created++
			require.Empty(t, res.header.Get(HeaderReplayed))
		case "existing":
			replayed++
			require.Equal(t, "true", res.header.Get(HeaderReplayed))
		default:
			t.Fatalf("outcome %q", res.header.Get(HeaderOutcome))
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, n-1, replayed)

	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{Workflow: "echo"})
	require.NoError(t, err)
	require.Len(t, page.Runs, 1)
	require.Equal(t, "race-1", page.Runs[0].RunID)
	require.EqualValues(t, n-1, page.Runs[0].Duplicates)
}

// A key reused with another input or another workflow is 422; the run
// keeps its input. Another object input names the top-level fields that
// differ (fields, and the detail), never their values.
func TestStartKeyReusedIs422(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("echo", "k-422", `{"n":1}`).code)

	for _, tc := range []struct {
		workflow, input string
		fields          []jetflow.FieldDiff
	}{
		{"echo", `{"n":2}`, []jetflow.FieldDiff{{Name: "n", Change: jetflow.FieldChanged}}},
		{"keyed", `{"n":1}`, nil},
	} {
		res := b.post(tc.workflow, "k-422", tc.input)
		require.Equal(t, http.StatusUnprocessableEntity, res.code, "body: %s", res.body)
		p := res.problem(t)
		require.Equal(t, "k-422", p.RunID)
		require.Contains(t, p.Detail, "idempotency conflict")
		require.Equal(t, tc.fields, p.Fields, "body: %s", res.body)
		if tc.fields != nil {
			require.Contains(t, p.Detail, `input fields differ: "n" (changed)`)
			require.Contains(t, string(res.body), `"fields":[{"name":"n","change":"changed"}]`)
		} else {
			require.NotContains(t, string(res.body), `"fields"`)
		}
		require.Empty(t, res.header.Get(HeaderReplayed))
	}
	run, err := b.client.GetRun(ctxT(t, 10*time.Second), "k-422")
	require.NoError(t, err)
	require.JSONEq(t, `{"n":1}`, string(run.Input))
	require.Equal(t, "echo", run.Workflow)
}

// A workflow with WithStrictInput refuses a body with a field its input
// type does not declare: 400, the detail naming the field, nothing
// stored. The same body to a workflow without it is started (the field
// dropped), and a declared body to the strict one too.
func TestStartStrictInputIs400(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.post("strict", "st-1", `{"n":1,"nn":2}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	p := res.problem(t)
	require.Equal(t, "st-1", p.RunID)
	require.Contains(t, p.Detail, `unknown field "nn"`)
	_, err := b.client.GetRun(ctxT(t, 10*time.Second), "st-1")
	require.ErrorIs(t, err, jetflow.ErrRunNotFound)

	require.Equal(t, http.StatusCreated, b.post("echo", "st-2", `{"n":1,"nn":2}`).code)
	require.Equal(t, http.StatusCreated, b.post("strict", "st-1", `{"n":1}`).code)
}

// A workflow whose policy rejects duplicates while running answers 409
// while its run is blocked; once the run has ended, the default
// (return the run) applies again.
func TestStartRejectedWhileRunningIs409(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.post("reject", "busy-1", `{"n":1,"block":true}`)
	require.Equal(t, http.StatusCreated, first.code, "body: %s", first.body)

	res := b.post("reject", "busy-1", `{"n":1,"block":true}`)
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	require.Equal(t, "busy-1", res.problem(t).RunID)

	b.release()
	b.waitDone("busy-1")
	again := b.post("reject", "busy-1", `{"n":1,"block":true}`)
	require.Equal(t, http.StatusCreated, again.code, "body: %s", again.body)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(HeaderReplayed))
}

// A workflow that requires a key: 400 with a link to the docs without
// one, nothing started; 201 with one.
func TestStartRequiredKeyMissingIs400WithLink(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.post("keyed", "", `{"n":1}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	p := res.problem(t)
	require.Equal(t, RunIDRequiredType, p.Type)
	require.True(t, strings.HasPrefix(p.Type, DocsURL+"#"))
	require.Equal(t, "<"+RunIDRequiredType+`>; rel="describedby"`, res.header.Get("Link"))

	// Nor does it take a generated ID.
	res = b.do(http.MethodPost, "/v1/workflows/keyed/runs?generate_run_id=true", nil, `{"n":1}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Equal(t, RunIDRequiredType, res.problem(t).Type)

	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{Workflow: "keyed"})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "nothing was started")

	require.Equal(t, http.StatusCreated, b.post("keyed", "pay-1", `{"n":1}`).code)
}

// Bad requests get a clear problem and start nothing.
func TestStartBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tooBig := `"` + strings.Repeat("x", MaxBodyBytes) + `"`
	for _, tc := range []struct {
		name   string
		header http.Header
		body   string
		path   string
		code   int
	}{
		{"invalid key", http.Header{HeaderIdempotencyKey: {"bad key!"}}, `{}`, "", 400},
		{"key too long", http.Header{HeaderIdempotencyKey: {strings.Repeat("k", 129)}}, `{}`, "", 400},
		{"unterminated string key", http.Header{HeaderIdempotencyKey: {`"abc`}}, `{}`, "", 400},
		{"two keys", http.Header{HeaderIdempotencyKey: {"a", "b"}}, `{}`, "", 400},
		{"invalid JSON", http.Header{HeaderIdempotencyKey: {"bad-1"}}, `{"n":`, "", 400},
		{"input does not decode", http.Header{HeaderIdempotencyKey: {"bad-2"}}, `"a string"`, "", 400},
		{"unknown workflow (no worker ever served it)", http.Header{HeaderIdempotencyKey: {"bad-3"}}, `{}`, "/v1/workflows/nope/runs", 404},
		{"invalid workflow name", http.Header{HeaderIdempotencyKey: {"bad-4"}}, `{}`, "/v1/workflows/a.b/runs", 404},
		{"not JSON", http.Header{HeaderIdempotencyKey: {"bad-5"}, "Content-Type": {"text/plain"}}, `{}`, "", 415},
		{"form", http.Header{HeaderIdempotencyKey: {"bad-6"}, "Content-Type": {"application/x-www-form-urlencoded"}}, `n=1`, "", 415},
		{"too large", http.Header{HeaderIdempotencyKey: {"bad-7"}}, tooBig, "", 413},
	} {
		path := tc.path
		if path == "" {
			path = "/v1/workflows/echo/runs"
		}
		res := b.do(http.MethodPost, path, tc.header, tc.body)
		require.Equal(t, tc.code, res.code, "%s: %s", tc.name, res.body)
		require.NotEmpty(t, res.problem(t).Detail, tc.name)
	}
	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "no bad request started a run")

	// A body just at the limit is accepted (and fails as input, not size).
	atLimit := `"` + strings.Repeat("x", MaxBodyBytes-2) + `"`
	res := b.post("echo", "at-limit", atLimit)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.NotContains(t, res.problem(t).Detail, "too large")
}
