package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// A start of a workflow that a worker served once but none serves now is
// "unavailable, retry later" (exit 5), not "not found" (exit 3): its
// workers may be restarting. A name no worker ever served is exit 3
// (TestErrors).
func TestStartOfAWorkflowWithoutWorkerExitsUnavailable(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	nc := testenv.Conn(t, tb.srv)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("retired", func(*jetflow.Context, greeting) (string, error) {
		return "", nil
	})))
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	require.NoError(t, w.Stop(ctx))

	producer := tb.cli(t, nil)
	code, out, errOut := producer("start", "retired", `{}`, "--id", "r-1")
	require.Equal(t, exitUnavailable, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, `no worker is running for workflow "retired"`)

	code, _, errOut = producer("get", "r-1")
	require.Equal(t, exitNotFound, code, "nothing stored: %s", errOut)
}

// Kubernetes may start producer serve before any worker: NATS, then the
// producer (ready: /readyz is 200, it reaches NATS), then the workers.
// Until a worker of the deployment has reported, a start is "retry later"
// whatever the name, since nothing tells a workflow whose workers are
// still to come from a typo yet: 503 with Retry-After over HTTP, exit 5
// on the command line, nothing stored. Once the worker is up, the same
// start creates the run, once; and then a misspelt name is 404 / exit 3.
func TestStartBeforeAnyWorkerReportedIsRetryable(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	tb := &testbed{url: srv.ClientURL(), srv: srv} // no worker yet
	base, _, _ := startServe(t, tb, nil)
	producer := tb.cli(t, nil)
	start := func(workflow, key string) response {
		h := http.Header{"Idempotency-Key": {key}, "Content-Type": {"application/json"}}
		return do(t, http.MethodPost, base+"/v1/workflows/"+workflow+"/runs", h, []byte(`{"name":"ada"}`))
	}

	require.Equal(t, http.StatusOK, do(t, http.MethodGet, base+"/readyz", nil, nil).code)
	for _, wf := range []string{"greet", "gret"} {
		res := start(wf, "k8s-1")
		require.Equal(t, http.StatusServiceUnavailable, res.code, "%s: %s", wf, res.body)
		require.Equal(t, "1", res.header.Get("Retry-After"))
		require.Contains(t, res.body, `no worker is running for workflow \"`+wf+`\": no worker of this deployment has reported yet`)
		code, out, errOut := producer("start", wf, `{"name":"ada"}`, "--id", "k8s-1")
		require.Equal(t, exitUnavailable, code, errOut)
		require.Empty(t, out)
		require.Contains(t, errOut, "no worker of this deployment has reported yet")
	}
	code, _, errOut := producer("get", "k8s-1")
	require.Equal(t, exitNotFound, code, "nothing stored: %s", errOut)

	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(greet()))
	w, err := jetflow.NewWorker(testenv.Conn(t, srv), ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Start(ctx)) // returns once it answers starts
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})

	created := start("greet", "k8s-1")
	require.Equal(t, http.StatusCreated, created.code, created.body)
	require.Equal(t, "created", created.header.Get("Jetflow-Outcome"))
	code, out, errOut := producer("start", "greet", `{"name":"ada"}`, "--id", "k8s-1")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^existing run k8s-1 \(status (running|completed), 1 duplicates absorbed\)\n$`, out)
	code, out, errOut = producer("wait", "k8s-1", "--timeout", "20s")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "run k8s-1 completed: \"hello, ada\"\n", out)
	code, out, errOut = producer("list")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, 1, strings.Count(out, "k8s-1"), "one run: %s", out)

	typo := start("gret", "k8s-2")
	require.Equal(t, http.StatusNotFound, typo.code, "a worker has reported now: %s", typo.body)
	code, _, errOut = producer("start", "gret", `{"name":"ada"}`, "--id", "k8s-2")
	require.Equal(t, exitNotFound, code, errOut)
}
