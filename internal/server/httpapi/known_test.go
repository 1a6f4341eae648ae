package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// A misspelt workflow is 404, a client error; a known workflow whose
// workers are all gone is 503 with Retry-After, for the client to retry
// with the same key. Neither starts anything.
func TestStartTellsUnknownWorkflowFromNoWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("retired", func(*jetflow.Context, echoIn) (int, error) { return 0, nil })))
	w, err := jetflow.NewWorker(testenv.Conn(t, b.ns), ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Stop(ctx))

	typo := b.do(http.MethodPost, "/v1/workflows/retird/runs", http.Header{HeaderIdempotencyKey: {"k-typo"}}, `{}`)
	require.Equal(t, http.StatusNotFound, typo.code, "body: %s", typo.body)
	require.Contains(t, typo.problem(t).Detail, `no worker serves "retird", and none ever has`)
	require.Empty(t, typo.header.Get("Retry-After"), "a typo is not worth retrying")

	gone := b.do(http.MethodPost, "/v1/workflows/retired/runs", http.Header{HeaderIdempotencyKey: {"k-gone"}}, `{}`)
	require.Equal(t, http.StatusServiceUnavailable, gone.code, "body: %s", gone.body)
	require.Contains(t, gone.problem(t).Detail, `no worker is running for workflow "retired"`)
	require.Equal(t, "1", gone.header.Get("Retry-After"))

	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "neither start stored a run")
}

// Kubernetes may start the API before any worker: NATS, then producer
// serve, then the workers. Until a worker of the deployment has reported,
// a start is 503 with Retry-After, whatever the name (nothing tells a
// workflow whose workers are still to come from a typo yet), and stores
// nothing. The client retries with the same key: once the worker is up,
// the retry creates the run, once; and then a misspelt name is 404.
func TestStartBeforeAnyWorkerReportedIs503(t *testing.T) {
	t.Parallel()
	requireContract(t)
	b := &bundle{t: t, observedCh: make(chan observation, 256)}
	b.ns = testenv.Server(t)
	var err error
	b.client, err = jetflow.NewClient(ctxT(t, 10*time.Second), testenv.Conn(t, b.ns), jetflow.ClientConfig{})
	require.NoError(t, err)
	s, err := New(Config{Backend: b.client, Logger: testenv.Logger(t), Observe: b.observe})
	require.NoError(t, err)
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)

	for _, name := range []string{"orders", "ordrs"} {
		res := b.post(name, "fresh-1", `{"n":2}`)
		require.Equal(t, http.StatusServiceUnavailable, res.code, "%s: body: %s", name, res.body)
		require.Equal(t, "1", res.header.Get("Retry-After"))
		require.Contains(t, res.problem(t).Detail,
			`no worker is running for workflow "`+name+`": no worker of this deployment has reported yet`)
	}
	require.Equal(t, http.StatusNotFound, b.do(http.MethodGet, "/v1/runs/fresh-1", nil, "").code, "nothing stored")

	var executions atomic.Int64
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("orders", func(ctx *jetflow.Context, in echoIn) (int, error) {
		return jetflow.Step(ctx, "double", func(context.Context) (int, error) {
			executions.Add(1)
			return in.N * 2, nil
		})
	})))
	runWorker(t, b.ns, ws, jetflow.WorkerConfig{}) // returns once it answers starts

	created := b.post("orders", "fresh-1", `{"n":2}`)
	require.Equal(t, http.StatusCreated, created.code, "body: %s", created.body)
	require.Equal(t, "created", created.header.Get(HeaderOutcome))
	replay := b.post("orders", "fresh-1", `{"n":2}`)
	require.Equal(t, http.StatusCreated, replay.code, "body: %s", replay.body)
	require.Equal(t, "true", replay.header.Get(HeaderReplayed))
	var run struct {
		Status     string `json:"status"`
		Output     int    `json:"output"`
		Duplicates int    `json:"duplicates"`
	}
	b.waitDone("fresh-1").json(t, &run)
	require.Equal(t, "completed", run.Status)
	require.Equal(t, 4, run.Output)
	require.Equal(t, 1, run.Duplicates, "the 503s stored nothing; the replay found the run")
	require.EqualValues(t, 1, executions.Load())
	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{})
	require.NoError(t, err)
	require.Len(t, page.Runs, 1)

	typo := b.post("ordrs", "fresh-2", `{}`)
	require.Equal(t, http.StatusNotFound, typo.code, "a worker has reported now: body: %s", typo.body)
	require.Empty(t, typo.header.Get("Retry-After"))
}
