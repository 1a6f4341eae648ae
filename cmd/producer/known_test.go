package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testenv"
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
