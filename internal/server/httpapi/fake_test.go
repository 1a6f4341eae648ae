package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// fakeBackend records StartByName, SendEvent and Resume calls and answers
// every call with err, or when err is nil with a created run, a delivered
// event.
type fakeBackend struct {
	err error

	mu     sync.Mutex
	starts []fakeStart
	events []fakeEvent
}

// fakeEvent is one SendEvent (runID and name set) or Resume (token set).
type fakeEvent struct {
	runID, name, token, eventID string
	payload                     json.RawMessage
}

type fakeStart struct {
	name  string
	input json.RawMessage
}

func (f *fakeBackend) StartByName(_ context.Context, name string, input json.RawMessage, _ ...jetflow.StartOption) (jetflow.StartResult, error) {
	f.mu.Lock()
	f.starts = append(f.starts, fakeStart{name: name, input: append(json.RawMessage(nil), input...)})
	f.mu.Unlock()
	if f.err != nil {
		return jetflow.StartResult{}, f.err
	}
	return jetflow.StartResult{RunID: "fake-run", Workflow: name, Outcome: jetflow.OutcomeCreated, Status: jetflow.StatusRunning}, nil
}

func (f *fakeBackend) GetRun(context.Context, string) (jetflow.Run, error) {
	return jetflow.Run{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) Describe(context.Context, string) (jetflow.RunDescription, error) {
	return jetflow.RunDescription{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) WaitRun(context.Context, string) (jetflow.Run, error) {
	return jetflow.Run{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) ListRuns(context.Context, jetflow.ListOptions) (jetflow.RunPage, error) {
	return jetflow.RunPage{}, f.err
}

func (f *fakeBackend) CountRuns(context.Context, string) (jetflow.RunCounts, error) {
	return jetflow.RunCounts{}, f.err
}

func (f *fakeBackend) Roster(context.Context) (jetflow.Roster, error) {
	return jetflow.Roster{Workers: []jetflow.LiveWorker{}, Workflows: []jetflow.KnownWorkflow{}}, f.err
}

func (f *fakeBackend) EngineStatus(context.Context) (jetflow.EngineStatus, error) {
	return jetflow.EngineStatus{Protocol: jetflow.EngineProtocol, Workers: map[string]int{}, Foreign: []jetflow.ForeignWorker{},
		Builds: map[string]map[string]int{}}, f.err
}

func (f *fakeBackend) ResetTaskKey(context.Context, string, jetflow.KeyScope, string) (int, error) {
	return 0, f.err
}

func (f *fakeBackend) CancelRun(context.Context, string) (jetflow.CancelOutcome, error) {
	return jetflow.CancelOutcome{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) UnblockRun(context.Context, string, jetflow.UnblockOptions) (jetflow.UnblockOutcome, error) {
	return jetflow.UnblockOutcome{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) Rerun(context.Context, string, jetflow.RerunOptions) (jetflow.RerunResult, error) {
	return jetflow.RerunResult{}, f.errOr(jetflow.ErrRunNotFound)
}

func (f *fakeBackend) SendEvent(_ context.Context, runID, name, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
	return f.event(fakeEvent{runID: runID, name: name, eventID: eventID, payload: payload})
}

func (f *fakeBackend) Resume(_ context.Context, token, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
	return f.event(fakeEvent{token: token, eventID: eventID, payload: payload})
}

// event records ev and answers it: err, or delivered to the run it names
// (fake-run for a hook).
func (f *fakeBackend) event(ev fakeEvent) (jetflow.EventResult, error) {
	ev.payload = append(json.RawMessage(nil), ev.payload...)
	f.mu.Lock()
	f.events = append(f.events, ev)
	f.mu.Unlock()
	runID, step := ev.runID, "event="+ev.name
	if ev.token != "" {
		runID, step = "fake-run", "hook=paid"
	}
	if f.err != nil {
		// As the client's: the run the workers found, with the error.
		return jetflow.EventResult{RunID: runID, EventID: ev.eventID}, f.err
	}
	return jetflow.EventResult{Outcome: jetflow.EventDelivered, RunID: runID, Workflow: "wf",
		StepID: runID + "." + step + ".0", EventID: ev.eventID}, nil
}

func (f *fakeBackend) eventCalls() []fakeEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeEvent(nil), f.events...)
}

func (f *fakeBackend) errOr(def error) error {
	if f.err != nil {
		return f.err
	}
	return def
}

func (f *fakeBackend) startCalls() []fakeStart {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeStart(nil), f.starts...)
}

// newTestServer serves h until t ends.
func newTestServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// expiredBackend answers every start as a new run created over an expired
// one with the same ID.
type expiredBackend struct{ fakeBackend }

func (e *expiredBackend) StartByName(ctx context.Context, name string, input json.RawMessage, opts ...jetflow.StartOption) (jetflow.StartResult, error) {
	res, err := e.fakeBackend.StartByName(ctx, name, input, opts...)
	res.AfterExpiry = true
	return res, err
}

// A start after the key's retention passed says so; others do not.
func TestAfterExpiryHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		backend Backend
		want    string
	}{{&fakeBackend{}, ""}, {&expiredBackend{}, "true"}} {
		s, err := New(Config{Backend: tc.backend})
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, "/v1/workflows/w/runs", strings.NewReader(`{}`))
		req.Header.Set(HeaderIdempotencyKey, "k-1")
		rec := serveChecked(t, s, req, checkAll)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Equal(t, tc.want, rec.Header().Get(HeaderAfterExpiry))
	}
}

// A query string that does not parse is refused with 400 on every route
// that reads one, never answered as if its filters were absent.
func TestMalformedQueryRefused(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Backend: &fakeBackend{}})
	require.NoError(t, err)
	for _, tc := range []struct{ method, target string }{
		{http.MethodGet, "/v1/runs?status=failed&workflow=%zz"},
		{http.MethodGet, "/v1/runs/counts?workflow=%"},
		{http.MethodGet, "/v1/runs/r-1/result?wait=%zz"},
		{http.MethodDelete, "/v1/task-keys/k?scope=%zz"},
		{http.MethodPost, "/v1/workflows/w/runs?attr.x=%zz"},
	} {
		req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(`{}`))
		req.Header.Set(HeaderIdempotencyKey, "k-1")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s %s: %s", tc.method, tc.target, rec.Body.String())
		require.Contains(t, rec.Body.String(), "malformed query string", tc.target)
	}
}
