package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// rerun sends POST /v1/runs/{id}/rerun with body ("" for none).
func (b *bundle) rerun(runID, body string) response {
	b.t.Helper()
	var h http.Header
	if body != "" {
		h = http.Header{"Content-Type": {"application/json"}}
	}
	return b.do(http.MethodPost, "/v1/runs/"+runID+"/rerun", h, body)
}

// rerunResult decodes an answer to a rerun with status code.
func (r response) rerunResult(t *testing.T, code int) jetflow.RerunResult {
	t.Helper()
	require.Equal(t, code, r.code, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var res jetflow.RerunResult
	r.json(t, &res)
	return res
}

// shipper is a workflow whose runs fail at their second step while the
// carrier is down, counting the calls of each step function.
type shipper struct {
	down           atomic.Bool
	charges, ships atomic.Int64
}

// shipperWorkflow is the name of shipper's workflow.
const shipperWorkflow = "shipper"

// serve runs a worker of the shipper workflow on b's NATS server: it
// charges (n), then ships (n*2), fatally failing while the carrier is
// down.
func (s *shipper) serve(t *testing.T, b *bundle) {
	t.Helper()
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow(shipperWorkflow, func(ctx *jetflow.Context, in echoIn) (int, error) {
		n, err := jetflow.Step(ctx, "charge", func(context.Context) (int, error) { s.charges.Add(1); return in.N, nil })
		if err != nil {
			return 0, err
		}
		return jetflow.Step(ctx, "ship", func(context.Context) (int, error) {
			s.ships.Add(1)
			if s.down.Load() {
				return 0, jetflow.Fatal(errors.New("carrier down"))
			}
			return n * 2, nil
		})
	})))
	runWorker(t, b.ns, ws, jetflow.WorkerConfig{})
}

// failedShipment starts the run id of the shipper workflow while the
// carrier is down and waits until it has failed at its ship step.
func (s *shipper) failedShipment(t *testing.T, b *bundle, id string) {
	t.Helper()
	s.down.Store(true)
	require.Equal(t, http.StatusCreated, b.post(shipperWorkflow, id, `{"n":3}`).code)
	var run jetflow.Run
	b.waitDone(id).json(t, &run)
	require.Equal(t, jetflow.StatusFailed, run.Status)
	require.Contains(t, run.Error.Message, "carrier down")
}

// stepNames are the names of steps, in order.
func stepNames(steps []jetflow.StepRecord) []string {
	names := []string{}
	for _, s := range steps {
		names = append(names, s.Name)
	}
	return names
}

// A run that failed at its ship step is rerun over HTTP. A dry run
// answers 200 with the plan (charge kept, ship again, the default run
// ID) and starts nothing. With the carrier back, the rerun is 201 with its
// start (created) and Location: the new run ships once more under its own
// step ID and completes without charging again, links to its source, and
// the source lists it (asked by "http"). A repeat, naming the step, is 200
// with start.outcome existing and runs nothing.
func TestRerunFailedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var s shipper
	s.serve(t, b)
	const id, rerunID = "ship-1", "ship-1-rerun-ship-0"
	s.failedShipment(t, b, id)
	require.EqualValues(t, 1, s.charges.Load())
	require.EqualValues(t, 1, s.ships.Load())

	res := b.rerun(id, `{"dry_run": true}`)
	plan := res.rerunResult(t, http.StatusOK)
	require.Empty(t, res.header.Get("Location"))
	require.Nil(t, plan.Start, "a dry run starts nothing: %s", res.body)
	require.NotContains(t, string(res.body), `"start"`)
	require.Equal(t, id, plan.SourceRunID)
	require.Equal(t, id+".ship.0", plan.From)
	require.Equal(t, rerunID, plan.RunID)
	require.Equal(t, []string{"charge"}, stepNames(plan.Kept))
	require.Equal(t, id+".charge.0", plan.Kept[0].StepID)
	require.JSONEq(t, `3`, string(plan.Kept[0].Output))
	require.Equal(t, []string{"ship"}, stepNames(plan.Again))
	require.Contains(t, plan.Again[0].Error, "carrier down")
	require.Equal(t, http.StatusNotFound, b.do(http.MethodGet, "/v1/runs/"+rerunID, nil, "").code, "the dry run started the rerun")

	s.down.Store(false)
	res = b.rerun(id, "")
	created := res.rerunResult(t, http.StatusCreated)
	require.Equal(t, "/v1/runs/"+rerunID, res.header.Get("Location"))
	require.Equal(t, plan.RerunPlan, created.RerunPlan, "the plan carried out is the one shown")
	require.NotNil(t, created.Start)
	require.Equal(t, jetflow.OutcomeCreated, created.Start.Outcome)
	require.Equal(t, rerunID, created.Start.RunID)
	require.Equal(t, shipperWorkflow, created.Start.Workflow)

	var run jetflow.Run
	b.waitDone(rerunID).json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.JSONEq(t, `6`, string(run.Output))
	require.Equal(t, &jetflow.RerunOf{RunID: id, From: id + ".ship.0"}, run.RerunOf)
	d := b.describe(rerunID)
	require.Equal(t, []string{"charge", "ship"}, stepNames(d.Steps))
	require.Equal(t, rerunID+".charge.0", d.Steps[0].StepID, "the kept step, under the rerun's step ID")
	require.Equal(t, rerunID+".ship.0", d.Steps[1].StepID)
	require.EqualValues(t, 1, s.charges.Load(), "the kept charge ran again")
	require.EqualValues(t, 2, s.ships.Load(), "ship runs once more, in the rerun")

	src := b.describe(id)
	require.Equal(t, jetflow.StatusFailed, src.Status, "the source is left as it ended")
	require.Len(t, src.Reruns, 1)
	require.Equal(t, rerunID, src.Reruns[0].RunID)
	require.Equal(t, id+".ship.0", src.Reruns[0].From)
	require.Equal(t, rerunSource, src.Reruns[0].Source)

	res = b.rerun(id, `{"from": "ship"}`)
	again := res.rerunResult(t, http.StatusOK)
	require.Empty(t, res.header.Get("Location"))
	require.Equal(t, rerunID, again.RunID)
	require.NotNil(t, again.Start)
	require.Equal(t, jetflow.OutcomeExisting, again.Start.Outcome)
	require.Equal(t, jetflow.StatusCompleted, again.Start.Status)
	require.Len(t, b.describe(id).Reruns, 1, "the repeat is listed once")
	require.EqualValues(t, 1, s.charges.Load())
	require.EqualValues(t, 2, s.ships.Load(), "the repeat ran nothing")
}

// A rerun refuses, and starts nothing: a run still running (409, its
// status, the rerun problem type), a step the run never reached (422,
// same type), an unknown run (404), a body with a field it does not have
// (400: a misspelt dry_run must not start a rerun), the source's own run
// ID (400).
func TestRerunRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var s shipper
	s.serve(t, b)
	const id = "ship-2"
	s.failedShipment(t, b, id)

	require.Equal(t, http.StatusCreated, b.post("echo", "running-2", `{"n":1,"block":true}`).code)
	res := b.rerun("running-2", "")
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	require.Equal(t, "running", res.header.Get(HeaderRunStatus))
	p := res.problem(t)
	require.Equal(t, RerunType, p.Type)
	require.Equal(t, "running-2", p.RunID)
	var notEnded struct {
		RunStatus string `json:"run_status"`
	}
	res.json(t, &notEnded)
	require.Equal(t, "running", notEnded.RunStatus)

	res = b.rerun(id, `{"from": "refund"}`)
	require.Equal(t, http.StatusUnprocessableEntity, res.code, "body: %s", res.body)
	p = res.problem(t)
	require.Equal(t, RerunType, p.Type)
	require.Equal(t, id, p.RunID)
	require.Contains(t, p.Detail, id+".refund.0")
	res = b.rerun(id, `{"from": "`+id+`.ship.1"}`)
	require.Equal(t, http.StatusUnprocessableEntity, res.code, "an occurrence past the last: %s", res.body)

	res = b.rerun("missing-2", `{"dry_run": true}`)
	require.Equal(t, http.StatusNotFound, res.code, "body: %s", res.body)
	require.Equal(t, "missing-2", res.problem(t).RunID)

	res = b.rerun(id, `{"dry_rum": true}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, `unknown field "dry_rum"`)
	res = b.rerun(id, `{"run_id": "`+id+`"}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "a run ID of its own")

	require.Empty(t, b.describe(id).Reruns, "nothing was rerun")
	require.Equal(t, http.StatusNotFound, b.do(http.MethodGet, "/v1/runs/"+id+"-rerun-ship-0", nil, "").code)
	require.EqualValues(t, 1, s.ships.Load())
}

// rerunBackend records the options of each rerun and answers with res
// and err, and a run of status for GetRun.
type rerunBackend struct {
	fakeBackend
	res    jetflow.RerunResult
	err    error
	status jetflow.RunStatus

	mu    sync.Mutex
	calls []jetflow.RerunOptions
}

func (u *rerunBackend) Rerun(_ context.Context, _ string, opts jetflow.RerunOptions) (jetflow.RerunResult, error) {
	u.mu.Lock()
	u.calls = append(u.calls, opts)
	u.mu.Unlock()
	return u.res, u.err
}

func (u *rerunBackend) GetRun(_ context.Context, runID string) (jetflow.Run, error) {
	if u.status == "" {
		return jetflow.Run{}, fmt.Errorf("%w: %s", jetflow.ErrUnavailable, runID)
	}
	return jetflow.Run{RunID: runID, Status: u.status}, nil
}

func (u *rerunBackend) options() []jetflow.RerunOptions {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]jetflow.RerunOptions(nil), u.calls...)
}

// The body's fields reach Client.Rerun (source "http"); none or {} asks
// for the defaults. A body that is not that object, names another field,
// is not JSON, too large or not JSON by its type reruns nothing. A
// backend's errors map to their statuses: a run not ended 409 (with its
// status when it can be read and has not ended since), a step not reached
// 422 (the rerun problem type), a refused write 403, NATS 503 with
// Retry-After, an unknown run 404, an invalid new run ID 400.
func TestRerunAnswers(t *testing.T) {
	t.Parallel()
	plan := jetflow.RerunPlan{SourceRunID: "r-1", From: "r-1.b.0", RunID: "r-1-rerun-b-0",
		Kept: []jetflow.StepRecord{{StepID: "r-1.a.0", Name: "a", Attempt: 1}}, Again: []jetflow.StepRecord{}}
	start := func(o jetflow.Outcome) *jetflow.StartResult {
		return &jetflow.StartResult{RunID: "r-1-rerun-b-0", Workflow: "w", Outcome: o, Status: jetflow.StatusRunning, Duplicates: 1}
	}
	planned := jetflow.RerunResult{RerunPlan: plan}
	notEnded := fmt.Errorf("%w: run r-1 is running", jetflow.ErrRunNotEnded)
	for _, tc := range []struct {
		name        string
		be          *rerunBackend
		contentType string
		body        string
		code        int
		asked       []jetflow.RerunOptions // nil: not called
		runStatus   string                 // the 409's
	}{
		{"no body", &rerunBackend{res: jetflow.RerunResult{RerunPlan: plan, Start: start(jetflow.OutcomeCreated)}},
			"", "", 201, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"all fields", &rerunBackend{res: planned}, "application/json; charset=utf-8",
			`{"from":"b","run_id":"again-1","dry_run":true}`, 200, []jetflow.RerunOptions{{From: "b", RunID: "again-1", DryRun: true, Source: "http"}}, ""},
		{"existing", &rerunBackend{res: jetflow.RerunResult{RerunPlan: plan, Start: start(jetflow.OutcomeExisting)}},
			"application/json", "{}", 200, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"misspelt", &rerunBackend{}, "application/json", `{"dryrun":true}`, 400, nil, ""},
		{"not a bool", &rerunBackend{}, "application/json", `{"dry_run":"yes"}`, 400, nil, ""},
		{"array", &rerunBackend{}, "application/json", `["b"]`, 400, nil, ""},
		{"two values", &rerunBackend{}, "application/json", `{} {}`, 400, nil, ""},
		{"not JSON", &rerunBackend{}, "application/json", `from=b`, 400, nil, ""},
		{"too large", &rerunBackend{}, "application/json", `{"from":"b"}` + strings.Repeat(" ", 64), 413, nil, ""},
		{"form", &rerunBackend{}, "application/x-www-form-urlencoded", `from=b`, 415, nil, ""},
		{"blocked", &rerunBackend{err: notEnded, status: jetflow.StatusBlocked}, "", "", 409, []jetflow.RerunOptions{{Source: "http"}}, "blocked"},
		{"status unread", &rerunBackend{err: notEnded}, "", "", 409, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"ended since", &rerunBackend{err: notEnded, status: jetflow.StatusCompleted}, "", "", 409, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"not reached", &rerunBackend{err: fmt.Errorf("%w: run generation r-1 has no step r-1.z.0", jetflow.ErrStepNotReached)},
			"application/json", `{"from":"z"}`, 422, []jetflow.RerunOptions{{From: "z", Source: "http"}}, ""},
		{"bad run ID", &rerunBackend{err: fmt.Errorf("%w: a rerun needs a run ID of its own", jetflow.ErrInvalidRunID)},
			"application/json", `{"run_id":"r-1"}`, 400, []jetflow.RerunOptions{{RunID: "r-1", Source: "http"}}, ""},
		{"denied", &rerunBackend{err: fmt.Errorf("%w: the NATS server refused a publish to $KV.jetflow_runs.r-1-rerun-b-0", jetflow.ErrPermissionDenied)},
			"", "", 403, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"unavailable", &rerunBackend{err: fmt.Errorf("jetflow: read run r-1: %w", jetflow.ErrUnavailable)},
			"", "", 503, []jetflow.RerunOptions{{Source: "http"}}, ""},
		{"unknown", &rerunBackend{err: fmt.Errorf("%w: r-1", jetflow.ErrRunNotFound)}, "", "", 404, []jetflow.RerunOptions{{Source: "http"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(Config{Backend: tc.be})
			require.NoError(t, err)
			s.maxBody = 64
			req := httptest.NewRequest(http.MethodPost, "/v1/runs/r-1/rerun", strings.NewReader(tc.body))
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
			require.Equal(t, tc.asked, tc.be.options())
			res := response{code: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}
			switch tc.code {
			case 200, 201:
				got := res.rerunResult(t, tc.code)
				require.Equal(t, tc.be.res, got)
				if tc.code == 201 {
					require.Equal(t, "/v1/runs/r-1-rerun-b-0", rec.Header().Get("Location"))
				} else {
					require.Empty(t, rec.Header().Get("Location"))
				}
			case 409:
				p := res.problem(t)
				require.Equal(t, RerunType, p.Type)
				require.Equal(t, "r-1", p.RunID)
				require.Equal(t, tc.runStatus, rec.Header().Get(HeaderRunStatus))
				var body struct {
					RunStatus string `json:"run_status"`
				}
				res.json(t, &body)
				require.Equal(t, tc.runStatus, body.RunStatus)
			case 422:
				require.Equal(t, RerunType, res.problem(t).Type)
			case 503:
				require.Equal(t, "1", rec.Header().Get("Retry-After"))
				require.Equal(t, "r-1", res.problem(t).RunID)
			default:
				res.problem(t)
			}
		})
	}

	s, err := New(Config{Backend: &rerunBackend{}, Tokens: []string{"tok"}})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, "/v1/runs/r-1/rerun", nil, "")
	require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, "/v1/runs/bad.id/rerun", http.Header{"Authorization": {"Bearer tok"}}, "")
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "run ID")
}

// The rerun problem type points at a section that exists in docs/http.md.
func TestRerunDocsAnchorExists(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/http.md")
	require.NoError(t, err)
	require.Equal(t, DocsURL+"#rerunning-a-run", RerunType)
	require.Regexp(t, `(?m)^## Rerunning a run$`, string(doc), "GitHub derives the anchor from this heading")
}
