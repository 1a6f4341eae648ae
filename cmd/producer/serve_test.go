package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// startServe runs serve for args with the environment vars until the test
// ends, waits until it serves (connected to NATS), and returns its base
// URL, its logs and a stop that cancels it as SIGTERM does and returns
// serve's error.
func startServe(t *testing.T, tb *testbed, vars map[string]string, args ...string) (string, *testenv.LogBuffer, func() error) {
	t.Helper()
	s := launchServe(t, tb, vars, args...)
	select {
	case addr := <-s.ready:
		return "http://" + addr, s.logs, s.stop
	case err := <-s.served:
		t.Fatalf("serve returned before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve not ready within 20s")
	}
	return "", nil, nil
}

// launchedServe is serve running in the test (launchServe).
type launchedServe struct {
	// listening and ready receive the API's address from serveHooks.
	listening, ready chan string
	// served receives serve's error when it returns.
	served chan error
	logs   *testenv.LogBuffer
	// logged is signalled (without blocking) after each log line.
	logged chan struct{}
	// stop cancels serve as SIGTERM does and returns its error.
	stop func() error
}

// launchServe runs serve for args with the environment vars until the
// test ends, and returns at once.
func launchServe(t *testing.T, tb *testbed, vars map[string]string, args ...string) *launchedServe {
	t.Helper()
	c, err := parseArgs(append([]string{"serve", "--http-addr", "127.0.0.1:0"}, args...), tb.env(vars), false, io.Discard)
	require.NoError(t, err)
	s := &launchedServe{
		listening: make(chan string, 1), ready: make(chan string, 1), served: make(chan error, 1),
		logs: &testenv.LogBuffer{}, logged: make(chan struct{}, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	hooks := serveHooks{
		listening: func(addr string) { s.listening <- addr },
		ready:     func(addr string) { s.ready <- addr },
	}
	go func() {
		s.served <- serve(ctx, c, tb.env(vars), zerolog.New(notifyingWriter{s.logs, s.logged}), hooks)
	}()
	var (
		once   sync.Once
		result error
	)
	s.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-s.served:
			case <-time.After(20 * time.Second):
				t.Error("serve did not stop within 20s")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = s.stop() }) // before the testbed's cleanups: last in, first out
	return s
}

// notifyingWriter writes to w, then signals written without blocking.
type notifyingWriter struct {
	w       io.Writer
	written chan struct{}
}

func (n notifyingWriter) Write(p []byte) (int, error) {
	k, err := n.w.Write(p)
	select {
	case n.written <- struct{}{}:
	default:
	}
	return k, err
}

// response is one HTTP answer.
type response struct {
	code   int
	header http.Header
	body   string
}

func do(t *testing.T, method, url string, header http.Header, body []byte) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

func TestServe(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	hooks := writeFile(t, "hooks.yaml", "- name: users\n  provider: standard\n  workflow: greet\n  secret_env: USERS_WEBHOOK_SECRET\n")
	const tok1, tok2 = "tok-one-5c1e", "tok-two-9d3f"
	vars := map[string]string{"USERS_WEBHOOK_SECRET": stdSecret, "JETFLOW_API_TOKEN": tok1 + ", " + tok2}
	base, logs, stop := startServe(t, tb, vars, "--webhooks", hooks)

	// A start with an Idempotency-Key, then its replay.
	const input = `{"name":"ada-payload-7f"}`
	start := func(token string) response {
		h := bearer(token)
		h.Set("Idempotency-Key", `"http-1"`)
		h.Set("Content-Type", "application/json")
		return do(t, http.MethodPost, base+"/v1/workflows/greet/runs", h, []byte(input))
	}
	require.Equal(t, http.StatusUnauthorized, start("wrong").code)
	first := start(tok2)
	require.Equal(t, http.StatusCreated, first.code, first.body)
	require.Equal(t, "created", first.header.Get("Jetflow-Outcome"))
	replay := start(tok1)
	require.Equal(t, http.StatusCreated, replay.code, replay.body)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.body, replay.body)

	res := do(t, http.MethodGet, base+"/v1/runs/http-1/result?wait=20s", bearer(tok1), nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	var run jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(res.body), &run))
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `"hello, ada-payload-7f"`, string(run.Output))

	res = do(t, http.MethodGet, base+"/v1/runs/http-1", bearer(tok2), nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.NoError(t, json.Unmarshal([]byte(res.body), &run))
	require.Equal(t, "greet", run.Workflow)
	require.Equal(t, int64(1), run.Duplicates)
	require.Len(t, run.Steps, 1)

	// A Standard Webhooks delivery signed with the secret from the
	// environment starts a run; one signed with another secret does not.
	body := []byte(`{"type":"user.created","name":"hook"}`)
	hook := func(secret string) response {
		h := webhook.Sign(webhook.Standard, secret, "msg_1", time.Now(), body)
		h.Set("Content-Type", "application/json")
		return do(t, http.MethodPost, base+"/v1/webhooks/users", h, body)
	}
	require.Equal(t, http.StatusUnauthorized, hook(stdSecret2).code)
	res = hook(stdSecret)
	require.Equal(t, http.StatusAccepted, res.code, res.body)
	require.JSONEq(t, `{"run_id":"users-msg_1","event_id":"msg_1","outcome":"created"}`, res.body)
	res = hook(stdSecret)
	require.Equal(t, http.StatusAccepted, res.code, res.body)
	require.JSONEq(t, `{"run_id":"users-msg_1","event_id":"msg_1","outcome":"existing"}`, res.body)
	code, out, errOut := tb.cli(t, nil)("wait", "users-msg_1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "run users-msg_1 completed: \"hello, hook\"\n", out)

	// Operations endpoints on the same port.
	res = do(t, http.MethodGet, base+"/healthz", nil, nil)
	require.Equal(t, http.StatusOK, res.code)
	res = do(t, http.MethodGet, base+"/readyz", nil, nil)
	require.Equal(t, http.StatusOK, res.code, res.body)
	require.JSONEq(t, `{"ready":true,"checks":{"jetflow":"ok","serving":"ok"}}`, res.body)
	res = do(t, http.MethodGet, base+"/metrics", nil, nil)
	require.Equal(t, http.StatusOK, res.code)
	for _, series := range []string{
		`jetflow_http_requests_total{code="201",route="POST /v1/workflows/{name}/runs"} 2`,
		`jetflow_http_requests_total{code="401",route="POST /v1/workflows/{name}/runs"} 1`,
		`jetflow_http_requests_total{code="202",route="POST /v1/webhooks/{source}"} 2`,
		`jetflow_http_requests_total{code="200",route="GET /v1/runs/{id}/result"} 1`,
	} {
		require.Regexp(t, "(?m)^"+regexp.QuoteMeta(series)+"$", res.body)
	}
	require.Contains(t, res.body, "go_goroutines ")
	require.Contains(t, res.body, "process_start_time_seconds ")
	require.Equal(t, http.StatusNotFound, do(t, http.MethodGet, base+"/nope", nil, nil).code)

	// SIGTERM: serve stops cleanly and the port closes.
	require.NoError(t, stop())
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/healthz", nil)
	require.NoError(t, err)
	_, err = http.DefaultClient.Do(req) // the server is gone: this fails at once
	require.Error(t, err)

	log := logs.String()
	require.Contains(t, log, `"message":"serving the API on /v1/ and /metrics /healthz /readyz"`)
	require.Contains(t, log, `"webhook_sources":["users"]`)
	require.Contains(t, log, `"message":"stopped"`)
	for _, secret := range []string{tok1, tok2, stdSecret, strings.TrimPrefix(stdSecret, "whsec_"), "ada-payload-7f", "user.created"} {
		require.NotContains(t, log, secret)
		require.NotContains(t, res.body, secret)
	}
}

// TestServeOpsAddr: with --ops-addr the operations endpoints move to their
// own listener, off the API's (which may face the internet for webhooks).
func TestServeOpsAddr(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	base, logs, stop := startServe(t, tb, nil, "--ops-addr", "127.0.0.1:0")

	var line struct {
		OpsAddr string `json:"ops_addr"`
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"ops_addr"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.NotEmpty(t, line.OpsAddr, "logs: %s", logs.String())
	ops := "http://" + line.OpsAddr

	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		require.Equal(t, http.StatusNotFound, do(t, http.MethodGet, base+path, nil, nil).code, "API port %s", path)
		res := do(t, http.MethodGet, ops+path, nil, nil)
		require.Equal(t, http.StatusOK, res.code, "ops port %s: %s", path, res.body)
	}
	require.Equal(t, http.StatusOK, do(t, http.MethodGet, base+"/v1/runs", nil, nil).code)
	require.Contains(t, do(t, http.MethodGet, ops+"/metrics", nil, nil).body, `jetflow_http_requests_total{code="200",route="GET /v1/runs"} 1`)
	require.NoError(t, stop())
}
