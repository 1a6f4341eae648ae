package workermain

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// waitingServe runs serve against a NATS URL where nothing listens yet,
// with an operations server, and returns the NATS port, the operations
// server's base URL, and channels for ready and for serve's result. It
// waits until /readyz says what the worker waits for.
func waitingServe(t *testing.T, ctx context.Context) (port int, ops string, ready chan Endpoints, served chan error) {
	ports := testenv.FreePorts(t, 2)
	port, opsPort := ports[0], ports[1]
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	ops = "http://127.0.0.1:" + strconv.Itoa(opsPort)
	cfg, err := parseConfig([]string{"--nats-url", url, "--ops-addr", "127.0.0.1:" + strconv.Itoa(opsPort)},
		env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
	ready, served = make(chan Endpoints, 1), make(chan error, 1)
	go func() { served <- serve(ctx, t, cfg, testenv.Logger(t), func(e Endpoints) { ready <- e }) }()

	// Alive at once, not ready, and saying why, after the first attempt.
	deadline := time.Now().Add(testWait)
	for {
		code, body := tryGet(t, ops+"/readyz")
		if code == http.StatusServiceUnavailable && containsAll(body, "waiting for NATS at "+url, "attempt") {
			break
		}
		select {
		case err := <-served:
			t.Fatalf("serve returned while NATS was away: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "/readyz never said what the worker waits for: %d %s", code, body)
		time.Sleep(natsconn.RetryFirst)
	}
	code, _ := get(t, ops+"/healthz")
	require.Equal(t, http.StatusOK, code, "a worker waiting for NATS is alive")
	return port, ops, ready, served
}

// The worker command started before its NATS server (Compose or
// Kubernetes starting everything at once): its operations server answers
// at once, alive and not ready, /readyz saying what it waits for, and it
// keeps trying instead of exiting. NATS comes up on its port: the worker
// serves within a backoff step and a start, and runs an order.
func TestServeWaitsForNATS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, ops, ready, served := waitingServe(t, ctx)

	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: port})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	select {
	case <-ready:
	case err := <-served:
		t.Fatalf("serve returned instead of connecting: %v", err)
	case <-time.After(natsconn.RetryMax + startTimeout):
		t.Fatalf("worker not serving %s after NATS came up", natsconn.RetryMax+startTimeout)
	}
	code, body := get(t, ops+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	nc, err := natsconn.Options{URL: srv.ClientURL()}.Connect(t.Name())
	require.NoError(t, err)
	defer nc.Close()
	completeOrder(t, nc, "late-nats-1")

	cancel()
	require.NoError(t, <-served)
}

// A worker stopped (SIGTERM) while it waits for NATS exits cleanly, at
// once.
func TestServeStoppedWhileWaitingForNATS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, _, _, served := waitingServe(t, ctx)
	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(testWait):
		t.Fatal("serve did not return after its context ended")
	}
}

// tryGet is get for a server that may not listen yet: 0 and the error.
func tryGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		return 0, err.Error() // not listening yet
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(b)
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
