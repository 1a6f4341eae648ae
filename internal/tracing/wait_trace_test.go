package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/internal/tracing"
)

// clockSlack is how far a wait span may stand outside the steps around
// it: the spans' times are taken by one machine's clock, at points a few
// calls apart.
const clockSlack = 50 * time.Millisecond

// waitEnv is a worker serving the wait workflows with tracing into rec, a
// client that does not trace, and the HTTP API over it.
type waitEnv struct {
	nc     *nats.Conn
	client *jetflow.Client
	api    *httptest.Server
	rec    *recorder
	wait   time.Duration
	evwait *jetflow.Workflow[int, bool]
	napper *jetflow.Workflow[int, int]
}

func newWaitEnv(t *testing.T) *waitEnv {
	t.Helper()
	rec := newRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec), sdktrace.WithIDGenerator(jetflow.TraceIDGenerator()))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	ns := testenv.Server(t)
	step := func(ctx *jetflow.Context, name string) error {
		_, err := jetflow.Step(ctx, name, func(context.Context) (int, error) { return 1, nil })
		return err
	}
	// evwait: step "before", a wait for the event "go" with a timeout of
	// its input in milliseconds, step "after"; it returns whether the wait
	// timed out.
	evwait := jetflow.NewWorkflow("evwait", func(ctx *jetflow.Context, ms int) (bool, error) {
		if err := step(ctx, "before"); err != nil {
			return false, err
		}
		_, err := jetflow.WaitEvent[string](ctx, "go", jetflow.WithTimeout(time.Duration(ms)*time.Millisecond))
		timedOut := errors.Is(err, jetflow.ErrEventTimeout)
		if err != nil && !timedOut {
			return false, err
		}
		return timedOut, step(ctx, "after")
	}, jetflow.WithEvent[string]("go"))
	// napper: steps "before", "mid" and "after" with a sleep "nap" of its
	// input in milliseconds between each two: the holder woken by the
	// second nap replays past the first.
	napper := jetflow.NewWorkflow("napper", func(ctx *jetflow.Context, ms int) (int, error) {
		for i, name := range []string{"before", "mid", "after"} {
			if i > 0 {
				if err := jetflow.Sleep(ctx, "nap", time.Duration(ms)*time.Millisecond); err != nil {
					return 0, err
				}
			}
			if err := step(ctx, name); err != nil {
				return 0, err
			}
		}
		return ms, nil
	})
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(evwait, napper))
	w, err := jetflow.NewWorker(testenv.Conn(t, ns), ws, jetflow.WorkerConfig{
		Logger: testenv.Logger(t), AckWait: ackWait, Tracing: jetflow.WithTracerProvider(tp),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 6*ackWait)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*ackWait)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	nc := testenv.Conn(t, ns)
	client, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	api, err := httpapi.New(httpapi.Config{Backend: client, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &waitEnv{nc: nc, client: client, api: srv, rec: rec, wait: 6 * ackWait, evwait: evwait, napper: napper}
}

// timers subscribes to the timers being stored and returns a function
// that waits for the next one of run runID: its run has begun a wait then
// (the timer is stored after the wait's record, when no event is there).
func (e *waitEnv) timers(t *testing.T) func(runID string) {
	t.Helper()
	sub, err := e.nc.SubscribeSync(jetstream.TimerSubjects)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, e.nc.Flush())
	return func(runID string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), e.wait)
		defer cancel()
		for {
			m, err := sub.NextMsgWithContext(ctx)
			require.NoError(t, err, "no timer stored for run %s", runID)
			if task, err := state.DecodeTask(m.Data); err == nil && task.RunID == runID {
				return
			}
		}
	}
}

// stepSpan is the one jetflow.step span of the step called name.
func stepSpan(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var out tracetest.SpanStubs
	for _, s := range named(spans, tracing.SpanStep) {
		if attr(s.Attributes, tracing.AttrStep) == name {
			out = append(out, s)
		}
	}
	require.Len(t, out, 1, "step %s: %v", name, names(spans))
	return out[0]
}

// checkWaitSpan checks that wait is a jetflow.wait span of the run whose
// spans are spans, a child of its run span in its trace, that stands
// between the spans of the steps before and after it and has the
// attributes want.
func checkWaitSpan(t *testing.T, spans tracetest.SpanStubs, wait tracetest.SpanStub, before, after string, want map[string]string) {
	t.Helper()
	run := named(spans, tracing.SpanRun)[0]
	require.Equal(t, run.SpanContext.TraceID(), wait.SpanContext.TraceID())
	require.Equal(t, run.SpanContext.SpanID(), wait.Parent.SpanID(), "the wait span is the run span's child")
	b, a := stepSpan(t, spans, before), stepSpan(t, spans, after)
	require.False(t, wait.StartTime.Before(b.EndTime.Add(-clockSlack)),
		"the wait (from %s) begins after step %s ends (%s)", wait.StartTime, before, b.EndTime)
	require.False(t, wait.EndTime.After(a.StartTime.Add(clockSlack)),
		"the wait (to %s) ends before step %s starts (%s)", wait.EndTime, after, a.StartTime)
	require.False(t, wait.EndTime.Before(wait.StartTime))
	for k, v := range want {
		var got string
		for _, kv := range wait.Attributes {
			if string(kv.Key) == k {
				got = kv.Value.Emit()
			}
		}
		require.Equal(t, v, got, "attribute %s of the wait span", k)
	}
	require.NotEmpty(t, attr(wait.Attributes, tracing.AttrWorker))
}

// A run with step, event wait (with a timeout) and step, its event sent
// while it waits by a caller in its own trace: the run's trace holds one
// wait span, between the two step spans, linked to the event's delivery;
// the delivery's span is in the caller's trace, linked to the run's span,
// and names the step it resumed.
func TestWaitSpanOfAnEvent(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	waiting := e.timers(t)
	_, err := jetflow.Start(ctx, e.client, e.evwait, int(time.Hour/time.Millisecond), jetflow.WithRunID("ev-1"))
	require.NoError(t, err)
	waiting("ev-1")
	sctx := trace.ContextWithRemoteSpanContext(ctx, knownParentContext(t))
	res, err := e.client.SendEvent(sctx, "ev-1", "go", "evt-1", json.RawMessage(`"now"`))
	require.NoError(t, err)
	require.Equal(t, jetflow.EventDelivered, res.Outcome)
	spans := e.rec.wait(t, "ev-1", e.wait)

	waits := named(spans, tracing.SpanWait)
	require.Len(t, waits, 1, "one wait span: %v", names(spans))
	wait := waits[0]
	checkWaitSpan(t, spans, wait, "before", "after", map[string]string{
		"jetflow.wait.kind": "event", "jetflow.event": "go", "jetflow.outcome": tracing.WaitEvent,
		"jetflow.step_id": res.StepID, "jetflow.step": state.EventStepName("go"), "jetflow.event_id": "evt-1",
		"jetflow.wait.hook_token": "false", "jetflow.run_id": "ev-1", "jetflow.workflow": "evwait",
	})
	until, err := time.Parse(time.RFC3339Nano, attr(wait.Attributes, tracing.AttrUntil))
	require.NoError(t, err, "the wait's deadline")
	require.WithinDuration(t, wait.StartTime.Add(time.Hour), until, clockSlack, "the deadline is the timeout after the wait began")
	require.Equal(t, codes.Unset, wait.Status.Code)
	require.Empty(t, attr(wait.Attributes, tracing.AttrEarly))

	deliveries := named(spans, tracing.SpanDeliver)
	require.Len(t, deliveries, 1, "one delivery span: %v", names(spans))
	deliver := deliveries[0]
	require.Equal(t, knownTrace, deliver.SpanContext.TraceID().String(), "the delivery is in the caller's trace")
	require.Equal(t, knownParent, deliver.Parent.SpanID().String())
	require.Equal(t, "delivered", attr(deliver.Attributes, tracing.AttrOutcome))
	require.Equal(t, res.StepID, attr(deliver.Attributes, tracing.AttrStepID))
	require.Equal(t, "evt-1", attr(deliver.Attributes, tracing.AttrEventID))
	run := named(spans, tracing.SpanRun)[0]
	require.Len(t, deliver.Links, 1)
	require.Equal(t, run.SpanContext.TraceID(), deliver.Links[0].SpanContext.TraceID(), "the delivery links to the run's span")
	require.Equal(t, run.SpanContext.SpanID(), deliver.Links[0].SpanContext.SpanID())

	require.Len(t, wait.Links, 1)
	require.Equal(t, deliver.SpanContext.SpanID(), wait.Links[0].SpanContext.SpanID(), "the wait links to the delivery")
	require.Equal(t, deliver.SpanContext.TraceID(), wait.Links[0].SpanContext.TraceID())
	require.Len(t, wait.Events, 1)
	require.Equal(t, tracing.EventDelivered, wait.Events[0].Name)
	require.Equal(t, "evt-1", attr(wait.Events[0].Attributes, tracing.AttrEventID))
	require.False(t, wait.Events[0].Time.Before(wait.StartTime))
	require.False(t, wait.Events[0].Time.After(wait.EndTime))

	// A repeat of the event is a duplicate: its delivery has a span, the
	// ended run no other wait span.
	res, err = e.client.SendEvent(sctx, "ev-1", "go", "evt-1", json.RawMessage(`"now"`))
	require.NoError(t, err)
	require.Equal(t, jetflow.EventDuplicate, res.Outcome)
	var dup []string
	for _, s := range e.rec.GetSpans() {
		if attr(s.Attributes, tracing.AttrRunID) == "ev-1" && (s.Name == tracing.SpanDeliver || s.Name == tracing.SpanWait) {
			dup = append(dup, s.Name+":"+attr(s.Attributes, tracing.AttrOutcome))
		}
	}
	require.ElementsMatch(t, []string{"jetflow.wait:event", "jetflow.event.deliver:delivered", "jetflow.event.deliver:duplicate"}, dup)
}

// A wait whose timeout passes gives a wait span with outcome timeout,
// from the wait's beginning to the timeout's commit, between its steps.
func TestWaitSpanOfATimeout(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	h, err := jetflow.Start(ctx, e.client, e.evwait, 200, jetflow.WithRunID("ev-timeout"))
	require.NoError(t, err)
	timedOut, err := h.Result(ctx)
	require.NoError(t, err)
	require.True(t, timedOut)
	spans := e.rec.wait(t, "ev-timeout", e.wait)
	waits := named(spans, tracing.SpanWait)
	require.Len(t, waits, 1, "one wait span: %v", names(spans))
	checkWaitSpan(t, spans, waits[0], "before", "after", map[string]string{
		"jetflow.wait.kind": "event", "jetflow.event": "go", "jetflow.outcome": tracing.WaitTimeout, "jetflow.event_id": "",
	})
	require.GreaterOrEqual(t, waits[0].EndTime.Sub(waits[0].StartTime), 200*time.Millisecond-clockSlack, "the wait lasted its timeout")
	require.Empty(t, waits[0].Events)
	require.Empty(t, named(spans, tracing.SpanDeliver))
}

// Two sleeps: one wait span each (outcome slept), between their steps;
// the holder woken by the second sleep replays past the first and emits
// nothing for it.
func TestWaitSpanOfASleep(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	h, err := jetflow.Start(ctx, e.client, e.napper, 100, jetflow.WithRunID("nap-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	spans := e.rec.wait(t, "nap-1", e.wait)
	waits := named(spans, tracing.SpanWait)
	require.Len(t, waits, 2, "one wait span per sleep: %v", names(spans))
	byStep := map[string]tracetest.SpanStub{}
	for _, w := range waits {
		byStep[attr(w.Attributes, tracing.AttrStepID)] = w
	}
	first, second := byStep[state.StepID("nap-1", "nap", 0)], byStep[state.StepID("nap-1", "nap", 1)]
	want := map[string]string{"jetflow.wait.kind": "sleep", "jetflow.outcome": tracing.WaitSlept, "jetflow.step": "nap"}
	checkWaitSpan(t, spans, first, "before", "mid", want)
	checkWaitSpan(t, spans, second, "mid", "after", want)
	for _, w := range waits {
		require.GreaterOrEqual(t, w.EndTime.Sub(w.StartTime), 100*time.Millisecond-clockSlack)
		until, err := time.Parse(time.RFC3339Nano, attr(w.Attributes, tracing.AttrUntil))
		require.NoError(t, err)
		require.WithinDuration(t, w.StartTime.Add(100*time.Millisecond), until, clockSlack)
	}
}

// An event sent over HTTP with a traceparent: its delivery's span is in
// the caller's trace; one sent over NATS request-reply with the header
// (lower case) too; the run's wait span links to the first.
func TestEventDeliveryJoinsTheCallersTrace(t *testing.T) {
	t.Parallel()
	e := newWaitEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	waiting := e.timers(t)
	_, err := jetflow.Start(ctx, e.client, e.evwait, int(time.Hour/time.Millisecond), jetflow.WithRunID("ev-http"))
	require.NoError(t, err)
	waiting("ev-http")
	req, err := http.NewRequest(http.MethodPost, e.api.URL+"/v1/runs/ev-http/events/go", strings.NewReader(`"now"`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "evt-http")
	req.Header.Set("traceparent", knownHeader)
	resp, err := e.api.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	spans := e.rec.wait(t, "ev-http", e.wait)
	deliveries := named(spans, tracing.SpanDeliver)
	require.Len(t, deliveries, 1, "spans: %v", names(spans))
	require.Equal(t, knownTrace, deliveries[0].SpanContext.TraceID().String())
	waits := named(spans, tracing.SpanWait)
	require.Len(t, waits, 1)
	require.Len(t, waits[0].Links, 1)
	require.Equal(t, deliveries[0].SpanContext.SpanID(), waits[0].Links[0].SpanContext.SpanID())

	// Request-reply: a refused event (the run has ended) has its span,
	// with the error code as outcome and an error status.
	msg := nats.NewMsg("jetflow.events")
	msg.Header["traceparent"] = []string{knownHeader}
	msg.Data = []byte(`{"run_id":"ev-http","name":"go","event_id":"evt-late","payload":"late"}`)
	_, err = e.nc.RequestMsgWithContext(ctx, msg)
	require.NoError(t, err)
	var refused tracetest.SpanStubs
	for _, s := range e.rec.GetSpans() {
		if s.Name == tracing.SpanDeliver && attr(s.Attributes, tracing.AttrEventID) == "evt-late" {
			refused = append(refused, s)
		}
	}
	require.Len(t, refused, 1)
	require.Equal(t, knownTrace, refused[0].SpanContext.TraceID().String())
	require.Equal(t, knownParent, refused[0].Parent.SpanID().String())
	require.Equal(t, "run_ended", attr(refused[0].Attributes, tracing.AttrOutcome))
	require.Equal(t, codes.Error, refused[0].Status.Code)
}

// A parent's wait for its child run: one wait span, outcome child_ended,
// naming the child and how it ended.
func TestWaitSpanOfAChild(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.postStart(t, "parent", "family-wait", knownHeader)
	spans := e.rec.wait(t, "family-wait", e.wait)
	waits := named(spans, tracing.SpanWait)
	require.Len(t, waits, 1, "spans: %v", names(spans))
	w := waits[0]
	run := named(spans, tracing.SpanRun)[0]
	require.Equal(t, run.SpanContext.SpanID(), w.Parent.SpanID())
	require.Equal(t, knownTrace, w.SpanContext.TraceID().String())
	require.Equal(t, state.WaitChild, attr(w.Attributes, tracing.AttrWaitKind))
	require.Equal(t, tracing.WaitChildEnded, attr(w.Attributes, tracing.AttrOutcome))
	require.Equal(t, "completed", attr(w.Attributes, tracing.AttrChildStatus))
	require.Equal(t, "child-of-family-wait", attr(w.Attributes, tracing.AttrChildRunID))
	require.False(t, w.EndTime.Before(w.StartTime))
	child := e.rec.wait(t, "child-of-family-wait", e.wait)
	childRun := named(child, tracing.SpanRun)[0]
	require.False(t, w.EndTime.Before(childRun.EndTime.Add(-clockSlack)), "the wait ends once the child has")
}
