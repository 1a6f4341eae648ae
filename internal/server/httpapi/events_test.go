package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// sendPath is the route of the event called name to the run runID.
func sendPath(runID, name string) string { return "/v1/runs/" + runID + "/events/" + name }

// event posts body to path with the event ID key ("" sends none).
func (b *bundle) event(path, key, body string) response {
	b.t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set(HeaderIdempotencyKey, key)
	}
	return b.do(http.MethodPost, path, h, body)
}

// delivery decodes a 200 answer's body, checking the status.
func (r response) delivery(t *testing.T) EventDelivery {
	t.Helper()
	require.Equal(t, http.StatusOK, r.code, "body: %s", r.body)
	var d EventDelivery
	r.json(t, &d)
	return d
}

// bucketKeys lists the keys of a KV bucket of the test's server, sorted.
func (b *bundle) bucketKeys(bucket string) []string {
	b.t.Helper()
	js, err := natsjs.New(testenv.Conn(b.t, b.ns))
	require.NoError(b.t, err)
	ctx := ctxT(b.t, 10*time.Second)
	kv, err := js.KeyValue(ctx, bucket)
	require.NoError(b.t, err)
	keys, err := kv.ListKeys(ctx)
	require.NoError(b.t, err)
	var out []string
	for k := range keys.Keys() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitHook waits until a run has registered the hook token: its record is
// in the hooks bucket (a KV watch, not a poll).
func (b *bundle) waitHook(token string) {
	b.t.Helper()
	js, err := natsjs.New(testenv.Conn(b.t, b.ns))
	require.NoError(b.t, err)
	ctx := ctxT(b.t, 20*time.Second)
	kv, err := js.KeyValue(ctx, jetstream.HooksBucket)
	require.NoError(b.t, err)
	w, err := kv.Watch(ctx, token)
	require.NoError(b.t, err)
	defer func() { require.NoError(b.t, w.Stop()) }()
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() == natsjs.KeyValuePut {
				return
			}
		case <-ctx.Done():
			b.t.Fatalf("hook %s was not registered: %v", token, ctx.Err())
		}
	}
}

// An event by run and name: sent before the run reaches its wait it is
// kept (delivered), a repeat is a duplicate, the same ID with another
// payload a conflict; the run then completes with the event's payload and
// its next step runs once; an event after the run ended is 409 with the
// state it ended in; an unknown run is 404, an undeclared event 422.
func TestSendEventHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("waiter", "ev-1", `{"block":true}`).code)

	first := b.event(sendPath("ev-1", "paid"), "pay-1", `{"ref":"r-77","cents":1999}`)
	d := first.delivery(t)
	require.Equal(t, EventDelivery{Outcome: jetflow.EventDelivered, RunID: "ev-1", Workflow: "waiter",
		StepID: "ev-1.event=paid.0", EventID: "pay-1"}, d)
	require.Empty(t, first.header.Get(HeaderReplayed))

	again := b.event(sendPath("ev-1", "paid"), `"pay-1"`, `{"cents":1999, "ref":"r-77"}`) // sf-string key, same JSON
	d.Outcome = jetflow.EventDuplicate
	require.Equal(t, d, again.delivery(t))
	require.Equal(t, "true", again.header.Get(HeaderReplayed))

	conflict := b.event(sendPath("ev-1", "paid"), "pay-1", `{"ref":"r-78","cents":1999}`)
	require.Equal(t, http.StatusConflict, conflict.code, "body: %s", conflict.body)
	p := conflict.problem(t)
	require.Equal(t, EventConflictType, p.Type)
	require.Equal(t, "ev-1", p.RunID)

	undeclared := b.event(sendPath("ev-1", "refund"), "ref-1", `{}`)
	require.Equal(t, http.StatusUnprocessableEntity, undeclared.code, "body: %s", undeclared.body)
	require.Contains(t, undeclared.problem(t).Detail, "declares no such event")

	missing := b.event(sendPath("nobody-1", "paid"), "pay-1", `{}`)
	require.Equal(t, http.StatusNotFound, missing.code)
	require.Equal(t, "nobody-1", missing.problem(t).RunID)

	b.release()
	var run jetflow.Run
	b.waitDone("ev-1").json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `"r-77"`, string(run.Output))
	require.Equal(t, int64(1), b.afters.Load())

	ended := b.event(sendPath("ev-1", "paid"), "pay-2", `{"ref":"r-79"}`)
	require.Equal(t, http.StatusConflict, ended.code, "body: %s", ended.body)
	require.Equal(t, "completed", ended.header.Get(HeaderRunStatus))
	var ep struct {
		Problem
		RunStatus string `json:"run_status"`
	}
	ended.json(t, &ep)
	require.Equal(t, EventRunEndedType, ep.Type)
	require.Equal(t, "completed", ep.RunStatus)
	require.Equal(t, "ev-1", ep.RunID)
}

// The same event sent 10 times at once: exactly one request delivers it,
// nine are duplicates naming the same wait, and the step after the wait
// runs once.
func TestConcurrentSameEventDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The run holds after its wait until release, so that no sender
	// finds it ended.
	require.Equal(t, http.StatusCreated, b.post("waiter", "conc-1", `{"hold_after":true}`).code)

	const senders = 10
	answers := make([]response, senders)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.event(sendPath("conc-1", "paid"), "pay-once", `{"ref":"once","cents":5}`)
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d concurrent sends of one event answered in %s", senders, time.Since(began))
	outcomes := map[jetflow.EventOutcome]int{}
	for _, a := range answers {
		d := a.delivery(t)
		require.Equal(t, "conc-1.event=paid.0", d.StepID)
		outcomes[d.Outcome]++
	}
	require.Equal(t, map[jetflow.EventOutcome]int{jetflow.EventDelivered: 1, jetflow.EventDuplicate: senders - 1}, outcomes)
	b.release()

	var run jetflow.Run
	b.waitDone("conc-1").json(t, &run)
	require.JSONEq(t, `"once"`, string(run.Output))
	require.Equal(t, int64(1), b.afters.Load(), "the step after the wait runs once")
}

// A hook: a token no run waits on is 404 and stores nothing; once the run
// waits on it the event is delivered, a repeat is a duplicate and another
// event a conflict (a hook resumes one wait once); after the run ended,
// both are 409.
func TestResumeHookHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("waiter", "hk-1", `{"token":"order-9-approval","hold_after":true}`).code)
	b.waitHook("order-9-approval")
	hooks, steps := b.bucketKeys(jetstream.HooksBucket), b.bucketKeys(jetstream.StepsBucket)

	unknown := b.event("/v1/hooks/no-such-token", "e-1", `{"ref":"x"}`)
	require.Equal(t, http.StatusNotFound, unknown.code, "body: %s", unknown.body)
	require.Contains(t, unknown.problem(t).Detail, "no-such-token")
	require.Equal(t, hooks, b.bucketKeys(jetstream.HooksBucket), "a 404 stores no hook")
	require.Equal(t, steps, b.bucketKeys(jetstream.StepsBucket), "a 404 stores no step")

	res := b.event("/v1/hooks/order-9-approval", "appr-1", `{"ref":"ok"}`)
	want := EventDelivery{Outcome: jetflow.EventDelivered, RunID: "hk-1", Workflow: "waiter",
		StepID: "hk-1.hook=paid.0", EventID: "appr-1"}
	require.Equal(t, want, res.delivery(t))

	again := b.event("/v1/hooks/order-9-approval", "appr-1", `{"ref":"ok"}`)
	want.Outcome = jetflow.EventDuplicate
	require.Equal(t, want, again.delivery(t))
	require.Equal(t, "true", again.header.Get(HeaderReplayed))

	other := b.event("/v1/hooks/order-9-approval", "appr-2", `{"ref":"ok"}`)
	require.Equal(t, http.StatusConflict, other.code, "body: %s", other.body)
	p := other.problem(t)
	require.Equal(t, EventConflictType, p.Type)
	require.Equal(t, "hk-1", p.RunID)

	b.release()
	var run jetflow.Run
	b.waitDone("hk-1").json(t, &run)
	require.JSONEq(t, `"ok"`, string(run.Output))
	require.Equal(t, int64(1), b.afters.Load())

	// After the run ended: the event it took is still a duplicate, another
	// is a conflict (the hook's one wait has ended).
	late := b.event("/v1/hooks/order-9-approval", "appr-1", `{"ref":"ok"}`)
	require.Equal(t, http.StatusOK, late.code, "body: %s", late.body)
	require.Contains(t, string(late.body), `"outcome":"duplicate"`)
	late = b.event("/v1/hooks/order-9-approval", "appr-2", `{"ref":"ok"}`)
	require.Equal(t, http.StatusConflict, late.code, "body: %s", late.body)
	require.Equal(t, EventConflictType, late.problem(t).Type)
}

// A payload that does not decode into the event's declared type is a 400
// that stores nothing, as are an oversized payload (413) and an invalid
// event name, hook token or event ID (400); the run waits on, and
// completes when a good event follows.
func TestEventPayloadRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("waiter", "bad-1", `{"block":true}`).code)
	steps := b.bucketKeys(jetstream.StepsBucket)

	bad := b.event(sendPath("bad-1", "paid"), "pay-bad", `{"ref":"r","cents":"lots"}`)
	require.Equal(t, http.StatusBadRequest, bad.code, "body: %s", bad.body)
	require.Contains(t, bad.problem(t).Detail, "invalid event payload")
	notJSON := b.event(sendPath("bad-1", "paid"), "pay-bad", `{"ref":`)
	require.Equal(t, http.StatusBadRequest, notJSON.code, "body: %s", notJSON.body)
	huge := b.event(sendPath("bad-1", "paid"), "pay-bad", `{"ref":"`+strings.Repeat("x", MaxBodyBytes)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, huge.code)
	huge.problem(t)
	for _, bad := range []struct{ path, key string }{
		{sendPath("bad-1", "pa.id"), "pay-bad"},               // invalid event name
		{"/v1/hooks/tok.en", "pay-bad"},                       // invalid hook token
		{sendPath("bad-1", "paid"), strings.Repeat("k", 300)}, // invalid event ID
	} {
		res := b.event(bad.path, bad.key, `{"ref":"r"}`)
		require.Equal(t, http.StatusBadRequest, res.code, "%s: %s", bad.path, res.body)
	}
	require.Equal(t, steps, b.bucketKeys(jetstream.StepsBucket), "a refused event stores nothing")

	// The refused event's ID is free: the good event may reuse it.
	good := b.event(sendPath("bad-1", "paid"), "pay-bad", `{"ref":"fixed","cents":3}`).delivery(t)
	require.Equal(t, jetflow.EventDelivered, good.Outcome)
	b.release()
	var run jetflow.Run
	b.waitDone("bad-1").json(t, &run)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `"fixed"`, string(run.Output))
}

// Requests the server refuses before asking the backend: no or a bad
// event ID, an invalid run ID, event name or token, a body that is not
// JSON, too large or of another content type. None reaches the backend.
func TestEventRequestErrors(t *testing.T) {
	t.Parallel()
	const run = "/v1/runs/r-1/events/paid"
	for _, tc := range []struct {
		name, path string
		header     http.Header
		body       string
		code       int
		detail     string
	}{
		{"no key", run, nil, `{}`, 400, "no Idempotency-Key header"},
		{"no key, a provider's delivery ID", run, http.Header{"Webhook-Id": {"msg_1"}}, `{}`, 400, "no Idempotency-Key header"},
		{"two keys", run, http.Header{HeaderIdempotencyKey: {"a", "b"}}, `{}`, 400, "2 Idempotency-Key headers"},
		{"empty key", run, http.Header{HeaderIdempotencyKey: {`""`}}, `{}`, 400, "invalid event ID: empty"},
		{"long key", run, http.Header{HeaderIdempotencyKey: {strings.Repeat("k", 257)}}, `{}`, 400, "invalid event ID: 257 bytes"},
		{"bad sf-string", run, http.Header{HeaderIdempotencyKey: {`"open`}}, `{}`, 400, "no closing quote"},
		{"invalid run ID", "/v1/runs/r.1/events/paid", http.Header{HeaderIdempotencyKey: {"e-1"}}, `{}`, 400, "invalid run ID"},
		{"invalid name", "/v1/runs/r-1/events/pa.id", http.Header{HeaderIdempotencyKey: {"e-1"}}, `{}`, 400, "invalid name"},
		{"invalid token", "/v1/hooks/t.1", http.Header{HeaderIdempotencyKey: {"e-1"}}, `{}`, 400, "invalid hook token"},
		{"not JSON", run, http.Header{HeaderIdempotencyKey: {"e-1"}}, `{"a":`, 400, "not valid JSON"},
		{"not JSON to a hook", "/v1/hooks/t-1", http.Header{HeaderIdempotencyKey: {"e-1"}}, `nope`, 400, "not valid JSON"},
		{"too large", run, http.Header{HeaderIdempotencyKey: {"e-1"}}, `"` + strings.Repeat("x", 200) + `"`, 413, "limit 64"},
		{"content type", run, http.Header{HeaderIdempotencyKey: {"e-1"}, "Content-Type": {"text/plain"}}, `{}`, 415, "must be JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fb := &fakeBackend{}
			s, err := New(Config{Backend: fb})
			require.NoError(t, err)
			s.maxBody = 64
			srv := newTestServer(t, s)
			res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodPost, tc.path, tc.header, tc.body)
			require.Equal(t, tc.code, res.code, "body: %s", res.body)
			require.Contains(t, res.problem(t).Detail, tc.detail)
			require.Empty(t, fb.eventCalls(), "refused before the backend")
		})
	}
}

// What the backend is given: the path's run, name or token, the key as
// the event ID (a structured-field string decoded), the body as the
// payload (an empty body is null).
func TestEventRequestReachesBackend(t *testing.T) {
	t.Parallel()
	fb := &fakeBackend{}
	s, err := New(Config{Backend: fb})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	ctx := ctxT(t, 10*time.Second)
	res := doCtx(t, ctx, srv, http.MethodPost, "/v1/runs/r-1/events/paid", http.Header{HeaderIdempotencyKey: {" evt 1/ü "}}, `{"a": 1}`)
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	res = doCtx(t, ctx, srv, http.MethodPost, "/v1/hooks/tok-1", http.Header{HeaderIdempotencyKey: {`"evt \"2\""`}}, ``)
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	var d EventDelivery
	res.json(t, &d)
	require.Equal(t, "fake-run", d.RunID)
	require.Equal(t, []fakeEvent{
		{runID: "r-1", name: "paid", eventID: "evt 1/\u00fc", payload: []byte(`{"a": 1}`)},
		{token: "tok-1", eventID: `evt "2"`, payload: []byte(`null`)},
	}, fb.eventCalls())
}

// endedBackend answers every event with ErrRunEnded and the state the run
// ended in (none when status is empty).
type endedBackend struct {
	fakeBackend
	status jetflow.RunStatus
}

func (e *endedBackend) SendEvent(_ context.Context, runID, _, _ string, _ json.RawMessage) (jetflow.EventResult, error) {
	return jetflow.EventResult{RunID: runID, RunStatus: e.status}, e.err
}

func (e *endedBackend) Resume(_ context.Context, _, _ string, _ json.RawMessage) (jetflow.EventResult, error) {
	return jetflow.EventResult{RunID: "r-1", RunStatus: e.status}, e.err
}

// Each error of a delivery gets its status and problem type, on both
// routes; an ended run's problem names its state when the delivery said
// it, and is a 409 without it when it did not.
func TestEventErrorStatuses(t *testing.T) {
	t.Parallel()
	ended := fmt.Errorf("%w: run r-1 is failed", jetflow.ErrRunEnded)
	for _, tc := range []struct {
		backend Backend
		code    int
		typ     string
		status  string
	}{
		{&fakeBackend{err: jetflow.ErrRunNotFound}, 404, "about:blank", ""},
		{&fakeBackend{err: jetflow.ErrHookNotFound}, 404, "about:blank", ""},
		{&fakeBackend{err: fmt.Errorf("%w: pay-1", jetflow.ErrEventConflict)}, 409, EventConflictType, ""},
		{&endedBackend{fakeBackend: fakeBackend{err: ended}, status: jetflow.StatusFailed}, 409, EventRunEndedType, "failed"},
		{&endedBackend{fakeBackend: fakeBackend{err: ended}}, 409, EventRunEndedType, ""},
		{&fakeBackend{err: jetflow.ErrUnknownEvent}, 422, "about:blank", ""},
		{&fakeBackend{err: jetflow.ErrEventPayload}, 400, "about:blank", ""},
		{&fakeBackend{err: jetflow.ErrInvalidEventID}, 400, "about:blank", ""},
		{&fakeBackend{err: jetflow.ErrInputTooLarge}, 413, "about:blank", ""},
		{&fakeBackend{err: fmt.Errorf("%w: publish to jetflow.events", jetflow.ErrPermissionDenied)}, 403, "about:blank", ""},
		{&fakeBackend{err: fmt.Errorf("%w: no worker is running to deliver the event", jetflow.ErrUnavailable)}, 503, "about:blank", ""},
		{&fakeBackend{err: errors.New("boom")}, 500, "about:blank", ""},
	} {
		s, err := New(Config{Backend: tc.backend})
		require.NoError(t, err)
		for _, path := range []string{"/v1/runs/r-1/events/paid", "/v1/hooks/tok-1"} {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
			req.Header.Set(HeaderIdempotencyKey, "e-1")
			rec := serveChecked(t, s, req, checkAll)
			require.Equal(t, tc.code, rec.Code, "%v %s: %s", tc.backend, path, rec.Body)
			var p struct {
				Problem
				RunStatus string `json:"run_status"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
			require.Equal(t, tc.typ, p.Type)
			require.Equal(t, tc.status, p.RunStatus)
			require.Equal(t, tc.status, rec.Header().Get(HeaderRunStatus))
			if tc.code == 503 {
				require.Equal(t, "1", rec.Header().Get("Retry-After"))
			}
		}
	}
}

// The problem types of events point at sections that exist in
// docs/http.md.
func TestEventDocsAnchorsExist(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/http.md")
	require.NoError(t, err)
	for typ, heading := range map[string]string{
		EventConflictType: "### Event conflict", EventRunEndedType: "### Event after the run ended",
	} {
		require.Equal(t, strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(heading, "### "), " ", "-")),
			strings.TrimPrefix(typ, DocsURL+"#"))
		require.True(t, strings.Contains(string(doc), "\n"+heading+"\n"), "docs/http.md lacks the heading %q (GitHub derives the anchor from it)", heading)
	}
}
