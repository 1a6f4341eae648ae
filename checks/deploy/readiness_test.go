package deploy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// TestWorkerUserPassesReadiness runs a worker as the least-privilege
// jetflow_worker user of nats/accounts.conf and asks it what /readyz asks:
// every probe of the deploy files depends on it (consumer info, bucket
// status); the backlog gauges are sampled with the same consumer info.
func TestWorkerUserPassesReadiness(t *testing.T) {
	t.Parallel()
	url := accountsServer(t)
	nc, err := jetflow.Connect(url, nats.UserInfo("jetflow_worker", natsPasswords["JETFLOW_WORKER_PASSWORD"]))
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("deploycheck", func(_ *jetflow.Context, in int) (int, error) {
		return in, nil
	})))
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{Concurrency: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(stopCtx))
	})

	readyCtx, cancelReady := context.WithTimeout(ctx, 5*time.Second)
	defer cancelReady()
	require.NoError(t, w.Ready(readyCtx), "the worker user cannot pass /readyz: check accounts.conf")
}

// accountsServer starts a nats-server with JetStream and the account of
// nats/accounts.conf on a free loopback port, and returns its URL. The
// passwords are defined as variables in a copy of the file instead of the
// environment, so that tests may run in parallel.
func accountsServer(t *testing.T) string {
	t.Helper()
	raw := readFile(t, filepath.Join("nats", "accounts.conf"))
	var vars []byte
	for k, v := range natsPasswords {
		vars = append(vars, k+": \""+v+"\"\n"...)
	}
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	require.NoError(t, os.WriteFile(conf, append(vars, raw...), 0o600))

	return testenv.ConfigServer(t, conf)
}
