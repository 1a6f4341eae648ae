package httpapi

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// lineWith is the one line with message msg and request_id id.
func lineWith(t *testing.T, lines []map[string]any, msg, id string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, l := range lines {
		if l["message"] == msg && l["request_id"] == id {
			found = append(found, l)
		}
	}
	require.Len(t, found, 1, "lines %q of request %s in %v", msg, id, lines)
	return found[0]
}

// TestRequestLog: a usable X-Request-Id is echoed and logged; a missing or
// unusable one is replaced by a generated one, echoed and logged; each
// request has one access line with its route, status, duration with its
// unit and, when the request names them, workflow and run_id; a server
// failure's log line names the request and no empty run_id.
func TestRequestLog(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	log := zerolog.New(&logs)
	backend := &fakeBackend{}
	api, err := New(Config{Backend: backend, Logger: log})
	require.NoError(t, err)
	srv := newTestServer(t, RequestLog(api, log))
	do := func(method, path string, header http.Header, body string) (int, string) {
		t.Helper()
		r := doCtx(t, ctxT(t, 10*time.Second), srv, method, path, header, body)
		return r.code, r.header.Get(HeaderRequestID)
	}

	code, id := do(http.MethodGet, "/v1/runs/run-7", http.Header{HeaderRequestID: {"abc-123"}}, "")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "abc-123", id, "the client's request ID is echoed")
	l := lineWith(t, logs.Lines(t), "request", "abc-123")
	require.Equal(t, "GET", l["method"])
	require.Equal(t, "GET /v1/runs/{id}", l["route"])
	require.Equal(t, "/v1/runs/run-7", l["path"])
	require.Equal(t, "run-7", l["run_id"])
	require.EqualValues(t, http.StatusNotFound, l["status"])
	took, ok := l["took"].(string)
	require.True(t, ok, "took is a string with its unit: %v", l["took"])
	_, err = time.ParseDuration(took)
	require.NoError(t, err)

	generated := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, sent := range []string{"", "has spaces", strings.Repeat("x", maxRequestIDLen+1), "caf\u00e9"} {
		h := http.Header{}
		if sent != "" {
			h.Set(HeaderRequestID, sent)
		}
		code, id = do(http.MethodPost, "/v1/workflows/order/runs", h, `{}`)
		require.Equal(t, http.StatusBadRequest, code, "no Idempotency-Key")
		require.Regexp(t, generated, id, "sent %q", sent)
		l = lineWith(t, logs.Lines(t), "request", id)
		require.Equal(t, "order", l["workflow"])
		require.NotContains(t, l, "run_id", "a start without a key names no run")
	}

	code, id = do(http.MethodPost, "/v1/workflows/order/runs", http.Header{HeaderIdempotencyKey: {"evt-9"}}, `{}`)
	require.Equal(t, http.StatusCreated, code)
	l = lineWith(t, logs.Lines(t), "request", id)
	require.Equal(t, "evt-9", l["run_id"])
	require.Equal(t, "order", l["workflow"])

	// An event's name is no workflow, and its key no run ID.
	code, id = do(http.MethodPost, "/v1/runs/run-8/events/paid", http.Header{HeaderIdempotencyKey: {"pay-1"}}, `{}`)
	require.Equal(t, http.StatusOK, code)
	l = lineWith(t, logs.Lines(t), "request", id)
	require.Equal(t, "run-8", l["run_id"])
	require.Equal(t, "paid", l["event"])
	require.Equal(t, "pay-1", l["event_id"])
	require.NotContains(t, l, "workflow")
	code, id = do(http.MethodPost, "/v1/hooks/tok-1", http.Header{HeaderIdempotencyKey: {"pay-2"}}, `{}`)
	require.Equal(t, http.StatusOK, code)
	l = lineWith(t, logs.Lines(t), "request", id)
	require.Equal(t, "pay-2", l["event_id"])
	require.NotContains(t, l, "run_id", "the key of a hook's event is no run ID")

	backend.err = errors.New("disk on fire")
	code, id = do(http.MethodGet, "/v1/runs", http.Header{HeaderRequestID: {"req-500"}}, "")
	require.Equal(t, http.StatusInternalServerError, code)
	require.Equal(t, "req-500", id)
	failed := lineWith(t, logs.Lines(t), "httpapi: request failed", "req-500")
	require.Equal(t, "disk on fire", failed["error"])
	require.NotContains(t, failed, "run_id", `no "run_id":"" on a failure that names no run`)
}

// TestOpenAPIDocumentsRequestID: the header RequestLog sets is the one
// openapi.yaml's shared component describes, and every shared error
// answer refers to it.
func TestOpenAPIDocumentsRequestID(t *testing.T) {
	t.Parallel()
	var doc struct {
		Components struct {
			Headers   map[string]any `yaml:"headers"`
			Responses map[string]struct {
				Headers map[string]struct {
					Ref string `yaml:"$ref"`
				} `yaml:"headers"`
			} `yaml:"responses"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(openapiYAML, &doc))
	require.Contains(t, doc.Components.Headers, "RequestId")
	require.NotEmpty(t, doc.Components.Responses)
	for name, r := range doc.Components.Responses {
		require.Equal(t, "#/components/headers/RequestId", r.Headers[HeaderRequestID].Ref, name)
	}
}
