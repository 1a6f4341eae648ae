package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// Each error a backend can return gets its status, as a problem.
func TestErrorStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("wrapped: %w", jetflow.ErrIdempotencyConflict), 422},
		{jetflow.ErrDuplicateRejected, 409},
		{jetflow.ErrRunIDRequired, 400},
		{jetflow.ErrUnknownWorkflow, 404},
		{&jetflow.NoWorkerError{Workflow: "order"}, 503},
		{jetflow.ErrInputTooLarge, 413},
		{jetflow.ErrInvalidInput, 400},
		{fmt.Errorf("jetflow: start x: %w", context.DeadlineExceeded), 503},
		{nats.ErrTimeout, 503},
		{nats.ErrConnectionClosed, 503},
		{nats.ErrNoServers, 503},
		{fmt.Errorf("jetflow: write x: %w", nats.ErrReconnectBufExceeded), 503},
		{nats.ErrConnectionReconnecting, 503},
		{nats.ErrNoResponders, 503},
		{natsjs.ErrJetStreamNotEnabled, 503},
		{natsjs.ErrNoStreamResponse, 503},
		{&natsjs.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}, 503},
		{&natsjs.APIError{Code: 500, ErrorCode: 10023, Description: "insufficient resources"}, 503},
		{jetflow.ErrUnavailable, 503},
		{&natsjs.APIError{Code: 400, ErrorCode: 10059, Description: "stream not found"}, 500},
		{errors.New("boom"), 500},
	} {
		s, err := New(Config{Backend: &fakeBackend{err: tc.err}, Observe: func(route string, code int, _ time.Duration) {
			require.Equal(t, "POST /v1/workflows/{name}/runs", route)
			require.Equal(t, tc.code, code)
		}})
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/v1/workflows/wf/runs", strings.NewReader(`{}`))
		req.Header.Set(HeaderIdempotencyKey, "r-1")
		rec := serveChecked(t, s, req, checkAll)
		require.Equal(t, tc.code, rec.Code, tc.err.Error())
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		var p Problem
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.Equal(t, Problem{Type: p.Type, Title: p.Title, Status: tc.code, Detail: tc.err.Error(), RunID: "r-1"}, p)
		require.NotEmpty(t, p.Title)
		if tc.code == 503 {
			require.Equal(t, "1", rec.Header().Get("Retry-After"))
		}
		if errors.Is(tc.err, jetflow.ErrRunIDRequired) {
			require.Equal(t, RunIDRequiredType, p.Type)
			require.Equal(t, "<"+RunIDRequiredType+`>; rel="describedby"`, rec.Header().Get("Link"))
		} else {
			require.Equal(t, "about:blank", p.Type)
			require.Equal(t, http.StatusText(tc.code), p.Title)
		}
	}
}

// panicky is a backend whose starts panic.
type panicky struct{ fakeBackend }

func (*panicky) StartByName(context.Context, string, json.RawMessage, ...jetflow.StartOption) (jetflow.StartResult, error) {
	panic("backend bug")
}

// A panicking handler answers 500 and the server keeps serving.
func TestPanicIs500(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Backend: &panicky{}})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, "/v1/workflows/wf/runs", http.Header{HeaderIdempotencyKey: {"p-1"}}, `{}`)
	require.Equal(t, http.StatusInternalServerError, res.code)
	require.NotContains(t, string(res.body), "backend bug")
	res.problem(t)
	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/openapi.yaml", nil, "")
	require.Equal(t, http.StatusOK, res.code)
}

// A request no route matches is a 404 or 405 problem, observed as
// "unmatched", never under its raw path.
func TestUnmatchedRoutes(t *testing.T) {
	t.Parallel()
	routesSeen := make(chan string, 4)
	s, err := New(Config{Backend: &fakeBackend{}, Observe: func(route string, _ int, _ time.Duration) { routesSeen <- route }})
	require.NoError(t, err)
	srv := newTestServer(t, s)

	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v2/secret-path", nil, "")
	require.Equal(t, http.StatusNotFound, res.code)
	res.problem(t)
	require.Equal(t, unmatched, <-routesSeen)

	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPut, "/v1/runs", nil, "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	require.Contains(t, res.header.Get("Allow"), http.MethodGet)
	res.problem(t)
	require.Equal(t, unmatched, <-routesSeen)

	res = doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/runs", nil, "")
	require.Equal(t, http.StatusOK, res.code)
	require.Equal(t, "GET /v1/runs", <-routesSeen)
}

// The docs link of the key-required problem points at a section that
// exists in docs/http.md.
func TestRunIDRequiredDocsAnchorExists(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/http.md")
	require.NoError(t, err)
	anchor := strings.TrimPrefix(RunIDRequiredType, DocsURL+"#")
	require.Equal(t, "idempotency-key-required", anchor)
	require.Contains(t, string(doc), "\n### Idempotency-Key required\n", "GitHub derives the anchor from this heading")
}
