package opshttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// get requests path from h and returns the status, content type and body.
func get(t *testing.T, h http.Handler, path string) (int, string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
	return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
}

func ok(context.Context) error { return nil }

func TestHealthzIsAliveWithoutChecks(t *testing.T) {
	t.Parallel()
	failing := opshttp.Check{Name: "nats", Fn: func(context.Context) error { return errors.New("down") }}
	code, ctype, body := get(t, opshttp.Handler(prometheus.NewRegistry(), failing), "/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not depend on checks")
	require.Equal(t, "text/plain; charset=utf-8", ctype)
	require.Equal(t, "ok\n", body)
}

func TestReadyzPasses(t *testing.T) {
	t.Parallel()
	h := opshttp.Handler(prometheus.NewRegistry(),
		opshttp.Check{Name: "nats", Fn: ok},
		opshttp.Check{Name: "kv", Fn: ok},
	)
	code, ctype, body := get(t, h, "/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "application/json", ctype)
	require.JSONEq(t, `{"ready":true,"checks":{"nats":"ok","kv":"ok"}}`, body)

	code, _, body = get(t, opshttp.Handler(prometheus.NewRegistry()), "/readyz")
	require.Equal(t, http.StatusOK, code, "no checks: ready")
	require.JSONEq(t, `{"ready":true,"checks":{}}`, body)
}

func TestReadyzFailsAndNamesTheCheck(t *testing.T) {
	t.Parallel()
	h := opshttp.Handler(prometheus.NewRegistry(),
		opshttp.Check{Name: "kv", Fn: ok},
		opshttp.Check{Name: "nats", Fn: func(context.Context) error {
			return errors.New("nats: no servers available\n\tfor connection")
		}},
		opshttp.Check{Name: "nil"},
		opshttp.Check{Name: "panics", Fn: func(context.Context) error { panic("boom") }},
	)
	code, ctype, body := get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "application/json", ctype)
	var got struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.False(t, got.Ready)
	require.Equal(t, map[string]string{
		"kv":     "ok",
		"nats":   "nats: no servers available for connection", // folded onto one line
		"nil":    `check "nil" has no function`,
		"panics": `check "panics" panicked: boom`,
	}, got.Checks)
}

func TestReadyzBoundsACheckThatIgnoresItsContext(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := opshttp.Handler(prometheus.NewRegistry(),
		opshttp.Check{Name: "kv", Fn: ok},
		opshttp.Check{Name: "stuck", Fn: func(context.Context) error {
			<-release
			return nil
		}},
	)
	start := time.Now()
	code, _, body := get(t, h, "/readyz")
	close(release)
	require.Less(t, time.Since(start), opshttp.CheckTimeout+5*time.Second)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"ready":false,"checks":{"kv":"ok","stuck":"check \"stuck\" did not finish within 2s"}}`, body)
}

func TestReadyzTruncatesLongErrors(t *testing.T) {
	t.Parallel()
	long := "x" + strings.Repeat("é", 1000) // the byte limit falls inside a rune
	h := opshttp.Handler(prometheus.NewRegistry(), opshttp.Check{Name: "long", Fn: func(context.Context) error {
		return errors.New(long)
	}})
	_, _, body := get(t, h, "/readyz")
	var got struct{ Checks map[string]string }
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	msg := got.Checks["long"]
	require.LessOrEqual(t, len(msg), 256+len("..."))
	require.True(t, strings.HasSuffix(msg, "..."))
	require.NotContains(t, msg, "\uFFFD", "no rune is cut in half")
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	m.Suppressed(metrics.LayerTaskKey)

	code, ctype, body := get(t, opshttp.Handler(reg), "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(ctype, "text/plain; version=0.0.4"), "content type %q", ctype)
	require.Contains(t, body, `jetflow_duplicates_suppressed_total{layer="task_key"} 1`)
}

func TestOtherPathsAre404(t *testing.T) {
	t.Parallel()
	h := opshttp.Handler(prometheus.NewRegistry())
	for _, path := range []string{"/", "/metricsx", "/healthz/x", "/v1/runs"} {
		code, _, _ := get(t, h, path)
		require.Equal(t, http.StatusNotFound, code, path)
	}
}

func TestRegisterSharesAMux(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runs/{id}", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	})
	opshttp.Register(mux, prometheus.NewRegistry())
	code, _, _ := get(t, mux, "/v1/runs/r1")
	require.Equal(t, http.StatusTeapot, code)
	code, _, _ = get(t, mux, "/healthz")
	require.Equal(t, http.StatusOK, code)
}

func TestServeUntilCancelled(t *testing.T) {
	t.Parallel()
	ln, err := opshttp.Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- opshttp.Serve(ctx, ln, opshttp.Handler(prometheus.NewRegistry())) }()

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "ok\n", string(body))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "a shutdown asked for by ctx is not an error")
	case <-time.After(opshttp.ShutdownTimeout + 5*time.Second):
		t.Fatal("Serve did not return after its context was done")
	}
	_, err = client.Get("http://" + ln.Addr().String() + "/healthz")
	require.Error(t, err, "the listener is closed")
}

func TestServeReportsAFailedListener(t *testing.T) {
	t.Parallel()
	ln, err := opshttp.Listen("127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	err = opshttp.Serve(t.Context(), ln, http.NotFoundHandler())
	require.Error(t, err)

	_, err = opshttp.Listen("127.0.0.1:-1")
	require.Error(t, err)
}

// NewServer is the one http.Server of producer serve (API and operations
// endpoints), the worker's operations endpoints and the HTTP benchmark:
// every timeout set but the write timeout, which would cut the API's long
// polls (they bound themselves by their wait and request timeout).
func TestNewServerTimeouts(t *testing.T) {
	t.Parallel()
	h := http.NewServeMux()
	srv := opshttp.NewServer(h)
	require.Same(t, http.Handler(h), srv.Handler)
	require.Equal(t, opshttp.ReadHeaderTimeout, srv.ReadHeaderTimeout)
	require.Equal(t, opshttp.ReadTimeout, srv.ReadTimeout)
	require.Equal(t, opshttp.IdleTimeout, srv.IdleTimeout)
	require.Positive(t, srv.ReadHeaderTimeout)
	require.Positive(t, srv.ReadTimeout)
	require.Positive(t, srv.IdleTimeout)
	require.Positive(t, srv.MaxHeaderBytes)
	if srv.WriteTimeout != 0 {
		require.Greater(t, srv.WriteTimeout, httpapi.MaxWait+2*httpapi.DefaultRequestTimeout, "a long poll must not be cut")
	}
}
