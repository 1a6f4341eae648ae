package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// natsAbsentFor is how long TestServeWaitsForNATS keeps NATS away: the
// start order of the issue, producer serve up 10 s before NATS.
const natsAbsentFor = 10 * time.Second

// waitingLines are serve's "waiting for NATS at <url>" log lines so far.
func waitingLines(t *testing.T, s *launchedServe, url string) []map[string]any {
	var out []map[string]any
	for _, l := range s.logs.Lines(t) {
		if l["message"] == "waiting for NATS at "+url {
			out = append(out, l)
		}
	}
	return out
}

// awaitLog waits, on serve's log writes, until cond holds of its logs, and
// fails the test at deadline or if serve returns meanwhile.
func awaitLog(t *testing.T, s *launchedServe, deadline time.Time, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for !cond() {
		select {
		case <-s.logged:
		case err := <-s.served:
			t.Fatalf("serve returned while waiting for %s: %v\n%s", what, err, s.logs)
		case <-timer.C:
			t.Fatalf("no %s by the deadline:\n%s", what, s.logs)
		}
	}
}

// producer serve started before NATS: it serves at once, alive and not
// ready, the API answering 503 with Retry-After, and retries; NATS comes
// up on its port after 10 s of that, and serve becomes ready within one
// backoff step (plus the client's setup), then starts a run once a worker
// has joined (503 "no worker" until then, which is retryable too).
func TestServeWaitsForNATS(t *testing.T) {
	t.Parallel()
	port := testenv.FreePorts(t, 1)[0]
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	tb := &testbed{url: url} // no server yet: the worker joins later
	began := time.Now()
	s := launchServe(t, tb, nil, "--log-format", "json")
	var base string
	select {
	case addr := <-s.listening:
		base = "http://" + addr
	case err := <-s.served:
		t.Fatalf("serve returned before it listened: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve not listening within 20s")
	}

	// Alive, not ready, and the API says "retry" (503), never 500.
	res := do(t, http.MethodGet, base+"/healthz", nil, nil)
	require.Equal(t, http.StatusOK, res.code)
	res = do(t, http.MethodGet, base+"/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, res.code, res.body)
	var readiness struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.body), &readiness))
	require.False(t, readiness.Ready)
	require.Contains(t, readiness.Checks["jetflow"], "has not reached NATS yet")
	require.Equal(t, "ok", readiness.Checks["serving"])
	startGreet := func(key string) response {
		h := http.Header{"Idempotency-Key": {key}, "Content-Type": {"application/json"}}
		return do(t, http.MethodPost, base+"/v1/workflows/greet/runs", h, []byte(`{"name":"early"}`))
	}
	res = startGreet("early-1")
	require.Equal(t, http.StatusServiceUnavailable, res.code, res.body)
	require.Equal(t, "1", res.header.Get("Retry-After"))
	require.Contains(t, res.body, "has not reached NATS yet")
	res = do(t, http.MethodGet, base+"/v1/runs", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, res.code, res.body)
	require.Equal(t, "1", res.header.Get("Retry-After"))

	// serve retries, logging each attempt, until NATS has been away for
	// natsAbsentFor: the first attempt logged after that.
	awaitLog(t, s, began.Add(natsAbsentFor+natsconn.RetryMax+20*time.Second), "attempt after 10s", func() bool {
		lines := waitingLines(t, s, url)
		if len(lines) == 0 {
			return false
		}
		waited, err := time.ParseDuration(lines[len(lines)-1]["waited"].(string))
		require.NoError(t, err)
		return waited >= natsAbsentFor
	})
	waiting := waitingLines(t, s, url)
	last := waiting[len(waiting)-1]
	require.Equal(t, float64(len(waiting)), last["attempt"], "every attempt is logged")
	require.Equal(t, "warn", last["level"])
	require.Equal(t, url, last["url"])
	require.Contains(t, last["error"], "connect to "+url)
	// The backoff grows to natsconn.RetryMax: about natsAbsentFor /
	// natsconn.RetryMax attempts at the cap, a few before it.
	require.GreaterOrEqual(t, len(waiting), int(natsAbsentFor/natsconn.RetryMax), "attempts in %s", natsAbsentFor)
	require.LessOrEqual(t, len(waiting), int(natsAbsentFor/natsconn.RetryMax)+8, "attempts in %s", natsAbsentFor)
	res = do(t, http.MethodGet, base+"/readyz", nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, res.code, res.body)
	require.Contains(t, res.body, "waiting for NATS at "+url, "/readyz says what serve waits for")

	// NATS comes up on that port: serve is ready within one backoff step
	// and the client's setup (its buckets bound within opTimeout).
	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: port})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	natsUp := time.Now()
	select {
	case <-s.ready:
	case err := <-s.served:
		t.Fatalf("serve returned instead of connecting: %v\n%s", err, s.logs)
	case <-time.After(natsconn.RetryMax + opTimeout + 10*time.Second):
		t.Fatalf("serve not ready %s after NATS came up:\n%s", natsconn.RetryMax+opTimeout+10*time.Second, s.logs)
	}
	readyAfter := time.Since(natsUp)
	res = do(t, http.MethodGet, base+"/readyz", nil, nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.JSONEq(t, `{"ready":true,"checks":{"jetflow":"ok","serving":"ok"}}`, res.body)
	log := s.logs.String()
	require.Contains(t, log, `"message":"reached NATS after waiting for it"`)
	require.Contains(t, log, `"message":"serving the API on /v1/ and /metrics /healthz /readyz"`)

	// No worker of the deployment has run yet: a start is 503, retryable;
	// once one has joined, the same start is created and completes.
	res = startGreet("early-1")
	require.Equal(t, http.StatusServiceUnavailable, res.code, res.body)
	require.Equal(t, "1", res.header.Get("Retry-After"))
	newTestbedOn(t, srv)
	res = startGreet("early-1")
	require.Equal(t, http.StatusCreated, res.code, res.body)
	res = do(t, http.MethodGet, base+"/v1/runs/early-1/result?wait=20s", nil, nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.Contains(t, res.body, `"output":"hello, early"`)

	t.Logf("serve retried NATS %d times over %s (first attempt to NATS up: %s); ready %s after NATS came up",
		len(waiting), last["waited"], natsUp.Sub(began).Round(time.Millisecond), readyAfter.Round(time.Millisecond))
	require.NoError(t, s.stop())
	require.Contains(t, s.logs.String(), `"message":"stopped"`)
}

// Stopped (SIGTERM) while it waits for NATS, serve exits cleanly.
func TestServeStopsWhileWaitingForNATS(t *testing.T) {
	t.Parallel()
	url := fmt.Sprintf("nats://127.0.0.1:%d", testenv.FreePorts(t, 1)[0])
	s := launchServe(t, &testbed{url: url}, nil)
	awaitLog(t, s, time.Now().Add(20*time.Second), "first attempt", func() bool { return len(waitingLines(t, s, url)) > 0 })
	require.NoError(t, s.stop())
	select {
	case <-s.ready:
		t.Fatal("ready without NATS")
	default:
	}
	require.Contains(t, s.logs.String(), `"message":"stopped"`)
}

// Credentials the server refuses do not become valid by waiting: serve
// exits with exit code 1 and says why, without the password.
func TestServeGivesUpOnRefusedCredentials(t *testing.T) {
	t.Parallel()
	srv := testenv.UserPassServer(t, "app", "right-pw-4c1d")
	env := (&testbed{url: srv.URL}).env(map[string]string{"JETFLOW_NATS_USER": "app", "JETFLOW_NATS_PASSWORD": "wrong-pw-8e2b"})
	c, err := parseArgs([]string{"serve", "--http-addr", "127.0.0.1:0"}, env, false, io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs := &testenv.LogBuffer{}
	listened := false
	err = serve(ctx, c, env, zerolog.New(logs), serveHooks{
		listening: func(string) { listened = true },
		ready:     func(string) { t.Error("ready with a refused password") },
	})
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NoError(t, ctx.Err(), "serve gave up by itself")
	require.True(t, listened, "serve listens before it dials")
	require.Equal(t, exitError, exitCode(err))
	require.NotContains(t, err.Error()+logs.String(), "wrong-pw-8e2b")
	require.NotContains(t, logs.String(), "waiting for NATS", "no retry of a refused credential")
}
