package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
)

// unblock sends POST /v1/runs/{id}/unblock with body ("" for none).
func (b *bundle) unblock(runID, body string) response {
	b.t.Helper()
	var h http.Header
	if body != "" {
		h = http.Header{"Content-Type": {"application/json"}}
	}
	return b.do(http.MethodPost, "/v1/runs/"+runID+"/unblock", h, body)
}

// unblocked decodes a 200 answer to an unblock.
func (r response) unblocked(t *testing.T) Unblocked {
	t.Helper()
	require.Equal(t, http.StatusOK, r.code, "body: %s", r.body)
	require.Equal(t, "running", r.header.Get(HeaderRunStatus))
	var u Unblocked
	r.json(t, &u)
	return u
}

// A run blocked by a renamed step, through the API: its JSON carries the
// block (kind, place, the history's and the code's step, the build,
// since), status=blocked lists it, the counts count it, its result is not
// ready (202). A plain unblock (empty body) replays it with the same code,
// which blocks it again and runs nothing; accepting the divergence waives
// the history's step, the renamed step runs (once more) and the run
// completes, listing the waived step. Unblocking it then is 409 with its
// status; an unknown run is 404.
func TestUnblockRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "blk-1"
	b.signup.Block(t, b.client, id)
	first, renamed := blocktest.StepID(id, blocktest.First), blocktest.StepID(id, blocktest.Renamed)

	d := b.describe(id)
	require.Equal(t, jetflow.StatusBlocked, d.Status)
	require.NotNil(t, d.Block)
	require.Equal(t, "divergence", d.Block.Reason)
	require.Equal(t, blocktest.Build, d.Block.Build)
	require.False(t, d.Block.Since.IsZero())
	div := d.Block.Divergence
	require.Equal(t, jetflow.DivergenceKind("renamed"), div.Kind)
	require.Equal(t, 0, div.Position)
	require.Equal(t, &jetflow.DivergedStep{StepID: first, Name: blocktest.First, Kind: "step"}, div.History)
	require.Equal(t, &jetflow.DivergedStep{StepID: renamed, Name: blocktest.Renamed, Kind: "step"}, div.Code)
	require.NotEmpty(t, div.Detail)
	require.Empty(t, d.Waived)

	b.waitListed("status=blocked", []string{id})
	res := b.do(http.MethodGet, "/v1/runs/counts?workflow="+blocktest.Workflow, nil, "")
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	require.JSONEq(t, `{"running":0,"blocked":1,"completed":0,"failed":0,"cancelled":0}`, string(res.body))
	res = b.do(http.MethodGet, "/v1/runs/"+id+"/result", nil, "")
	require.Equal(t, http.StatusAccepted, res.code, "a blocked run has not ended: %s", res.body)
	require.Equal(t, "blocked", res.header.Get(HeaderRunStatus))

	// Replayed with the same code: blocked again, at a later time, and the
	// renamed step did not run.
	require.Equal(t, Unblocked{RunID: id, Status: jetflow.StatusRunning}, b.unblock(id, "").unblocked(t))
	require.Eventually(t, func() bool {
		again := b.describe(id)
		return again.Status == jetflow.StatusBlocked && again.Block.Since.After(d.Block.Since)
	}, 30*time.Second, 10*time.Millisecond, "the unblocked run was not replayed")
	require.Zero(t, b.signup.Effects(renamed))

	// Accepted: the history's step is waived, the code's step runs.
	res = b.unblock(id, `{"accept_divergence": true}`)
	require.Equal(t, Unblocked{RunID: id, Status: jetflow.StatusRunning, Waived: first}, res.unblocked(t))
	var run jetflow.Run
	b.waitDone(id).json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, []string{first}, run.Waived)
	require.Nil(t, run.Block)
	require.Equal(t, 1, b.signup.Effects(first))
	require.Equal(t, 1, b.signup.Effects(renamed), "the accepted step ran")

	res = b.unblock(id, "")
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	require.Equal(t, "completed", res.header.Get(HeaderRunStatus))
	p := res.problem(t)
	require.Equal(t, RunNotBlockedType, p.Type)
	require.Equal(t, id, p.RunID)
	var notBlocked struct {
		RunStatus string `json:"run_status"`
	}
	res.json(t, &notBlocked)
	require.Equal(t, "completed", notBlocked.RunStatus)

	res = b.unblock("missing-1", `{"accept_divergence": false}`)
	require.Equal(t, http.StatusNotFound, res.code, "body: %s", res.body)
	require.Equal(t, "missing-1", res.problem(t).RunID)
}

// After a rollback (the run's first code back), a plain unblock lets the
// blocked run go on at once, and nothing ran twice; a running run is not
// blocked (409, status running).
func TestUnblockAfterRollback(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "blk-2"
	b.signup.Block(t, b.client, id)
	b.signup.Restore(id)
	require.Equal(t, Unblocked{RunID: id, Status: jetflow.StatusRunning}, b.unblock(id, "{}").unblocked(t))
	var run jetflow.Run
	b.waitDone(id).json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.Empty(t, run.Waived)
	require.Equal(t, 1, b.signup.Effects(blocktest.StepID(id, blocktest.First)))
	require.Zero(t, b.signup.Effects(blocktest.StepID(id, blocktest.Renamed)))
	require.Equal(t, 1, b.signup.Effects(blocktest.StepID(id, blocktest.Last)))

	require.Equal(t, http.StatusCreated, b.post("echo", "running-1", `{"n":1,"block":true}`).code)
	res := b.unblock("running-1", "")
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	require.Equal(t, "running", res.header.Get(HeaderRunStatus))
	require.Equal(t, RunNotBlockedType, res.problem(t).Type)
}

// unblockBackend records the options of each unblock and answers with out
// and err.
type unblockBackend struct {
	fakeBackend
	out jetflow.UnblockOutcome
	err error

	mu    sync.Mutex
	calls []jetflow.UnblockOptions
}

func (u *unblockBackend) UnblockRun(_ context.Context, runID string, opts jetflow.UnblockOptions) (jetflow.UnblockOutcome, error) {
	u.mu.Lock()
	u.calls = append(u.calls, opts)
	u.mu.Unlock()
	out := u.out
	out.RunID = runID
	return out, u.err
}

func (u *unblockBackend) options() []jetflow.UnblockOptions {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]jetflow.UnblockOptions(nil), u.calls...)
}

// The body says whether to accept the divergence (none or {}: no); a body that is not that object, names another field (a
// misspelt accept_divergence must not unblock without accepting), is not
// JSON or is too large unblocks nothing. A backend's errors map to their
// statuses: nothing to waive 422 (its problem type), a refused write 403,
// NATS 503 with Retry-After, an unknown run 404, without a token 401.
func TestUnblockAnswers(t *testing.T) {
	t.Parallel()
	running := jetflow.UnblockOutcome{Status: jetflow.StatusRunning}
	for _, tc := range []struct {
		name        string
		be          *unblockBackend
		contentType string
		body        string
		code        int
		accept      []bool // what the backend was asked; nil: not called
		answer      string
	}{
		{"no body", &unblockBackend{out: running}, "", "", 200, []bool{false}, `{"run_id":"r-1","status":"running"}`},
		{"empty object", &unblockBackend{out: running}, "application/json", "{}", 200, []bool{false}, ""},
		{"accept", &unblockBackend{out: jetflow.UnblockOutcome{Status: jetflow.StatusRunning, Waived: "r-1.a.0"}},
			"application/json; charset=utf-8", `{"accept_divergence":true}`, 200, []bool{true}, `{"run_id":"r-1","status":"running","waived":"r-1.a.0"}`},
		{"misspelt", &unblockBackend{out: running}, "application/json", `{"accept_divergance":true}`, 400, nil, ""},
		{"not a bool", &unblockBackend{out: running}, "application/json", `{"accept_divergence":"yes"}`, 400, nil, ""},
		{"array", &unblockBackend{out: running}, "application/json", `[true]`, 400, nil, ""},
		{"two values", &unblockBackend{out: running}, "application/json", `{} {}`, 400, nil, ""},
		{"not JSON", &unblockBackend{out: running}, "application/json", `accept`, 400, nil, ""},
		{"too large", &unblockBackend{out: running}, "application/json", `{"accept_divergence":true}` + strings.Repeat(" ", 64), 413, nil, ""},
		{"form", &unblockBackend{out: running}, "application/x-www-form-urlencoded", `accept_divergence=true`, 415, nil, ""},
		{"nothing to waive", &unblockBackend{err: fmt.Errorf("%w: diverges at step 0 (input-changed)", jetflow.ErrNothingToWaive)},
			"application/json", `{"accept_divergence":true}`, 422, []bool{true}, ""},
		{"denied", &unblockBackend{err: fmt.Errorf("%w: the NATS server refused a publish to $KV.jetflow_runs.r-1", jetflow.ErrPermissionDenied)},
			"", "", 403, []bool{false}, ""},
		{"unavailable", &unblockBackend{err: fmt.Errorf("jetflow: unblocked run r-1, but could not wake it (its recheck timer will): %w", jetflow.ErrUnavailable)},
			"", "", 503, []bool{false}, ""},
		{"unknown", &unblockBackend{err: fmt.Errorf("%w: r-1", jetflow.ErrRunNotFound)}, "", "", 404, []bool{false}, ""},
		{"not blocked, status unread", &unblockBackend{err: jetflow.ErrRunNotBlocked}, "", "", 409, []bool{false}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(Config{Backend: tc.be})
			require.NoError(t, err)
			s.maxBody = 64
			req := httptest.NewRequest(http.MethodPost, "/v1/runs/r-1/unblock", strings.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			// A request the document refuses (a body it does not describe)
			// is sent anyway: only the answer is checked.
			mode := checkAll
			if tc.code == 400 || tc.code == 413 || tc.code == 415 {
				mode = checkAnswer
			}
			rec := serveChecked(t, s, req, mode)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			var asked []bool
			for _, o := range tc.be.options() {
				asked = append(asked, o.AcceptDivergence)
			}
			require.Equal(t, tc.accept, asked)
			res := response{code: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}
			switch {
			case tc.code == 200 && tc.answer != "":
				require.JSONEq(t, tc.answer, rec.Body.String())
			case tc.code == 200:
			case tc.code == 422:
				require.Equal(t, NothingToWaiveType, res.problem(t).Type)
			case tc.code == 503:
				require.Equal(t, "1", rec.Header().Get("Retry-After"))
				require.Equal(t, "r-1", res.problem(t).RunID)
			case tc.code == 409:
				require.Equal(t, RunNotBlockedType, res.problem(t).Type)
				require.Empty(t, rec.Header().Get(HeaderRunStatus), "no status read, none claimed")
			default:
				res.problem(t)
			}
		})
	}

	s, err := New(Config{Backend: &unblockBackend{}, Tokens: []string{"tok"}})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, "/v1/runs/r-1/unblock", nil, "")
	require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, "/v1/runs/bad.id/unblock", http.Header{"Authorization": {"Bearer tok"}}, "")
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "run ID")
}

// The unblock problem types point at sections that exist in docs/http.md.
func TestUnblockDocsAnchorsExist(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/http.md")
	require.NoError(t, err)
	for typ, heading := range map[string]string{RunNotBlockedType: "Unblocking a run", NothingToWaiveType: "Accepting a divergence"} {
		anchor := strings.ToLower(strings.ReplaceAll(heading, " ", "-"))
		require.Equal(t, DocsURL+"#"+anchor, typ)
		require.Regexp(t, `(?m)^##+ `+heading+`$`, string(doc), "GitHub derives the anchor from this heading")
	}
}
