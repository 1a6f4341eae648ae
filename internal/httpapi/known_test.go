package httpapi

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testenv"
)

// A misspelt workflow is 404, a client error; a known workflow whose
// workers are all gone is 503 with Retry-After, for the client to retry
// with the same key. Neither starts anything.
func TestStartTellsUnknownWorkflowFromNoWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ws := jetflow.NewWorkers()
	require.NoError(t, ws.Add(jetflow.NewWorkflow("retired", func(*jetflow.Context, echoIn) (int, error) { return 0, nil })))
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
