package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/otlptest"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/internal/tracing/otlp"
)

// producer serve with OTEL_EXPORTER_OTLP_ENDPOINT: the run it cancels ends
// in its process, which exports the run's span, in the trace of the HTTP
// start's traceparent and under OTEL_SERVICE_NAME, by the time it stops.
func TestServeExportsTheSpansOfRunsItCancels(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	collector := otlptest.New(t)
	base, _, stop := startServe(t, tb, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "producer-under-test",
	})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	post := func(path string, header map[string]string, body string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		return resp.StatusCode
	}
	require.Equal(t, http.StatusCreated, post("/v1/workflows/hold/runs", map[string]string{
		"Content-Type": "application/json", "Idempotency-Key": "held-1",
		"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01",
	}, `{"name":"ada"}`))
	require.Equal(t, http.StatusOK, post("/v1/runs/held-1/cancel", nil, ""))
	require.NoError(t, stop()) // flushes the spans
	var all []byte
	for _, r := range collector.Traces() {
		all = append(all, r.Body...)
	}
	require.NotEmpty(t, all, "no OTLP request on /v1/traces")
	body := string(all)
	require.Contains(t, body, "producer-under-test")
	require.Contains(t, body, tracing.SpanRun)
	require.Contains(t, body, "held-1")
	id, err := hex.DecodeString(traceID)
	require.NoError(t, err)
	require.Contains(t, body, string(id), "the run span is in the start's trace")
}

// An OTLP endpoint that is not an http(s) URL stops serve before it
// serves.
func TestServeRefusesAnInvalidOTLPEndpoint(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	env := tb.env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
	c, err := parseArgs([]string{"serve", "--http-addr", "127.0.0.1:0"}, env, false, io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = serve(ctx, c, env, zerolog.Nop(), serveHooks{listening: func(string) { t.Error("serve listened") }})
	require.ErrorIs(t, err, otlp.ErrInvalidEndpoint)
}
