package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/internal/tracing"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// The known trace context the tests start with.
const (
	knownTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	knownParent = "00f067aa0ba902b7"
	knownHeader = "00-" + knownTrace + "-" + knownParent + "-01"
)

// recorder is the in-memory exporter, with a signal when a jetflow.run
// span has been exported: a run's spans are complete then (its steps end
// before the run's end is recorded).
type recorder struct {
	*tracetest.InMemoryExporter
	mu   sync.Mutex
	runs map[string]chan struct{} // run ID -> closed once its run span is exported
	// exported gets a value (if none waits in it) after every export.
	exported chan struct{}
}

func newRecorder() *recorder {
	return &recorder{InMemoryExporter: tracetest.NewInMemoryExporter(), runs: map[string]chan struct{}{}, exported: make(chan struct{}, 1)}
}

func (r *recorder) done(runID string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.runs[runID]
	if !ok {
		ch = make(chan struct{})
		r.runs[runID] = ch
	}
	return ch
}

func (r *recorder) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := r.InMemoryExporter.ExportSpans(ctx, spans)
	for _, s := range spans {
		if s.Name() == tracing.SpanRun {
			close(r.done(attr(s.Attributes(), tracing.AttrRunID)))
		}
	}
	select {
	case r.exported <- struct{}{}:
	default:
	}
	return err
}

// wait returns the spans of the trace of runID once its run span is
// exported, or fails at the deadline.
func (r *recorder) wait(t *testing.T, runID string, d time.Duration) tracetest.SpanStubs {
	t.Helper()
	select {
	case <-r.done(runID):
	case <-time.After(d):
		t.Fatalf("no %s span for run %s within %s; spans: %v", tracing.SpanRun, runID, d, names(r.GetSpans()))
	}
	var out tracetest.SpanStubs
	for _, s := range r.GetSpans() {
		if attr(s.Attributes, tracing.AttrRunID) == runID {
			out = append(out, s)
		}
	}
	return out
}

// named returns the spans of spans called name.
func named(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// attr is the value of key among kvs, as a string ("" when absent).
func attr(kvs []attribute.KeyValue, key attribute.Key) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// names are the names of spans, for failure messages.
func names(spans tracetest.SpanStubs) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name
	}
	return out
}

// env is a worker serving the "three" workflow (steps a, b, c; b fails its
// first attempt and is retried once) with tracing into rec, a client, and
// the HTTP API over it.
type env struct {
	nc     *nats.Conn
	client *jetflow.Client
	api    *httptest.Server
	rec    *recorder
	// wait bounds a run: the step retry's backoff is milliseconds, the
	// rest is NATS round trips.
	wait time.Duration
	tp   *sdktrace.TracerProvider
	// started gets the run ID of a blocker run once its step runs.
	started chan string
	three   *jetflow.Workflow[int, int]
}

// ackWait is the workers' AckWait; waits in the tests derive from it. A
// step redelivered after a stall would add a step span: running steps
// extend their deadline every third of it, so a stall must outlast it.
const ackWait = 10 * time.Second

func newEnv(t *testing.T) *env {
	t.Helper()
	rec := newRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rec), sdktrace.WithIDGenerator(jetflow.TraceIDGenerator()))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	ns := testenv.Server(t)
	var failed sync.Map // run ID -> b failed once
	three := jetflow.NewWorkflow("three", func(ctx *jetflow.Context, in int) (int, error) {
		info := func(name string, fn func(runID string) (int, error)) (int, error) {
			return jetflow.Step(ctx, name, func(sctx context.Context) (int, error) {
				d, _ := jetflow.StepDetailsFrom(sctx)
				return fn(d.RunID)
			}, jetflow.WithBackoff(time.Millisecond, 10*time.Millisecond))
		}
		a, err := info("a", func(string) (int, error) { return in + 1, nil })
		if err != nil {
			return 0, err
		}
		b, err := info("b", func(runID string) (int, error) {
			if _, again := failed.LoadOrStore(runID, true); !again {
				return 0, errors.New("b fails its first attempt")
			}
			return a * 2, nil
		})
		if err != nil {
			return 0, err
		}
		return info("c", func(string) (int, error) { return b + 1, nil })
	})
	// parent runs "three" as a child run with its input.
	parent := jetflow.NewWorkflow("parent", func(ctx *jetflow.Context, in int) (int, error) {
		return jetflow.Child(ctx, three, in, jetflow.WithChildRunID("child-of-"+ctx.RunID())).Get(ctx)
	})
	// blocker's step runs until its run is cancelled; started tells when.
	started := make(chan string, 1)
	blocker := jetflow.NewWorkflow("blocker", func(ctx *jetflow.Context, in int) (int, error) {
		return jetflow.Step(ctx, "wait", func(sctx context.Context) (int, error) {
			started <- ctx.RunID()
			<-sctx.Done()
			return 0, sctx.Err()
		})
	})
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(three, parent, blocker))
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
	// The client does not trace: the trace context reaches the worker
	// through the start request's headers.
	client, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	api, err := httpapi.New(httpapi.Config{Backend: client, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &env{nc: nc, client: client, api: srv, rec: rec, wait: 6 * ackWait, tp: tp, started: started, three: three}
}

// postStart starts run runID of workflow over HTTP with the given
// traceparent header ("" for none) and checks it was created.
func (e *env) postStart(t *testing.T, workflow, runID, traceparent string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.api.URL+"/v1/workflows/"+workflow+"/runs", strings.NewReader("1"))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", runID)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", "vendor=x")
	}
	resp, err := e.api.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}

// checkTrace checks the spans of a completed run of "three": all in one
// trace; one jetflow.start span, a child of parent (invalid: a root); one
// jetflow.run span, its child; four jetflow.step spans (b twice), children
// of the run span, b's first attempt retried with an error status. It
// returns the trace ID.
func checkTrace(t *testing.T, spans tracetest.SpanStubs, parent trace.SpanContext) trace.TraceID {
	t.Helper()
	require.Len(t, named(spans, tracing.SpanStart), 1, "spans: %v", names(spans))
	require.Len(t, named(spans, tracing.SpanRun), 1, "spans: %v", names(spans))
	require.Len(t, named(spans, tracing.SpanStep), 4, "spans: %v", names(spans))
	start, run := named(spans, tracing.SpanStart)[0], named(spans, tracing.SpanRun)[0]
	tid := start.SpanContext.TraceID()
	if parent.IsValid() {
		require.Equal(t, parent.TraceID(), tid)
		require.Equal(t, parent.SpanID(), start.Parent.SpanID(), "the start span is the caller's span's child")
	} else {
		require.False(t, start.Parent.IsValid(), "a start without (valid) trace context begins a trace")
	}
	for _, s := range spans {
		require.Equal(t, tid, s.SpanContext.TraceID(), "span %s in another trace", s.Name)
	}
	require.Equal(t, "created", attr(start.Attributes, tracing.AttrOutcome))
	require.Equal(t, start.SpanContext.SpanID(), run.Parent.SpanID(), "the run span is the start span's child")
	require.Equal(t, "completed", attr(run.Attributes, tracing.AttrStatus))
	require.Equal(t, codes.Unset, run.Status.Code)
	require.False(t, run.StartTime.After(start.EndTime), "the run span starts when the run was created")

	attempts := map[string][]string{} // step -> outcomes by attempt
	for _, s := range named(spans, tracing.SpanStep) {
		require.Equal(t, run.SpanContext.SpanID(), s.Parent.SpanID(), "step span %s is the run span's child", attr(s.Attributes, tracing.AttrStepID))
		require.NotEmpty(t, attr(s.Attributes, tracing.AttrWorker))
		require.Equal(t, "false", attr(s.Attributes, tracing.AttrTaskKeyHit))
		name, n := attr(s.Attributes, tracing.AttrStep), attr(s.Attributes, tracing.AttrAttempt)
		outcome := attr(s.Attributes, tracing.AttrOutcome)
		attempts[name] = append(attempts[name], n+":"+outcome)
		if outcome == tracing.StepRetried {
			require.Equal(t, codes.Error, s.Status.Code)
			require.Contains(t, s.Status.Description, "first attempt")
		} else {
			require.Equal(t, codes.Unset, s.Status.Code)
		}
	}
	require.Equal(t, []string{"1:committed"}, attempts["a"])
	require.ElementsMatch(t, []string{"1:retried", "2:committed"}, attempts["b"])
	require.Equal(t, []string{"1:committed"}, attempts["c"])
	return tid
}

func knownParentContext(t *testing.T) trace.SpanContext {
	sc, ok := tracing.Parse(knownHeader)
	require.True(t, ok)
	return sc
}

// An HTTP start with a traceparent header: the run's spans are one trace,
// the caller's, with the start, run and step spans in that order of
// parents, the retried attempt's span too.
func TestHTTPStartTraceparentIsTheRunsTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.postStart(t, "three", "http-traced", knownHeader)
	spans := e.rec.wait(t, "http-traced", e.wait)
	checkTrace(t, spans, knownParentContext(t))
}

// A malformed traceparent is ignored: the start is created and its run is
// traced in a new trace.
func TestMalformedTraceparentStartsANewTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.postStart(t, "three", "http-malformed", "00-zz-nonsense-01")
	spans := e.rec.wait(t, "http-malformed", e.wait)
	tid := checkTrace(t, spans, trace.SpanContext{})
	require.NotEqual(t, knownTrace, tid.String())
}

// A start admitted by a process that does not trace (a client without
// Tracing) still carries the caller's trace context into the run: the
// worker's run span is the caller's span's child, its steps the run's.
func TestUntracedAdmissionCarriesTheTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	ctx = trace.ContextWithRemoteSpanContext(ctx, knownParentContext(t))
	_, err := jetflow.Start(ctx, e.client, e.three, 1, jetflow.WithRunID("untraced-admission"))
	require.NoError(t, err)
	spans := e.rec.wait(t, "untraced-admission", e.wait)
	require.Equal(t, []string{tracing.SpanRun}, names(named(spans, tracing.SpanRun)))
	require.Empty(t, named(spans, tracing.SpanStart), "the client does not trace")
	run := named(spans, tracing.SpanRun)[0]
	require.Equal(t, knownTrace, run.SpanContext.TraceID().String())
	require.Equal(t, knownParent, run.Parent.SpanID().String())
	steps := named(spans, tracing.SpanStep)
	require.Len(t, steps, 4)
	for _, s := range steps {
		require.Equal(t, run.SpanContext.SpanID(), s.Parent.SpanID())
		require.Equal(t, knownTrace, s.SpanContext.TraceID().String())
	}
}

// A child run joins its parent's trace: its jetflow.start span is a child
// of the parent's run span, and its own spans follow as for any run.
func TestChildRunJoinsTheParentsTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.postStart(t, "parent", "family", knownHeader)
	parentSpans := e.rec.wait(t, "family", e.wait)
	childSpans := e.rec.wait(t, "child-of-family", e.wait)
	var parentRun trace.SpanContext
	for _, s := range parentSpans {
		require.Equal(t, knownTrace, s.SpanContext.TraceID().String(), "span %s", s.Name)
		if s.Name == tracing.SpanRun {
			parentRun = s.SpanContext
		}
	}
	require.True(t, parentRun.IsValid(), "the parent's run span: %v", names(parentSpans))
	checkTrace(t, childSpans, parentRun)
}

// A run cancelled by a client that traces: the client, which records
// the run's end, emits its run span (status cancelled), the parent of the
// step span cut short.
func TestCancelledRunSpanFromTheClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	client, err := jetflow.NewClient(ctx, e.nc, jetflow.ClientConfig{Tracing: jetflow.WithTracerProvider(e.tp)})
	require.NoError(t, err)
	e.postStart(t, "blocker", "cancelled-1", knownHeader)
	select {
	case <-e.started:
	case <-ctx.Done():
		t.Fatal("the blocker's step never started")
	}
	_, err = client.CancelRun(ctx, "cancelled-1")
	require.NoError(t, err)
	spans := e.rec.wait(t, "cancelled-1", e.wait)
	var run tracetest.SpanStub
	for _, s := range spans {
		require.Equal(t, knownTrace, s.SpanContext.TraceID().String(), "span %s", s.Name)
		if s.Name == tracing.SpanRun {
			run = s
		}
	}
	require.Equal(t, "cancelled", attr(run.Attributes, tracing.AttrStatus))
	// The step span ends when the worker sees the cancel: after the run
	// span, so it is waited for separately.
	deadline := time.After(e.wait)
	for {
		for _, s := range e.rec.GetSpans() {
			if s.Name == tracing.SpanStep && attr(s.Attributes, tracing.AttrRunID) == "cancelled-1" {
				require.Equal(t, run.SpanContext.SpanID(), s.Parent.SpanID())
				require.Equal(t, tracing.StepDropped, attr(s.Attributes, tracing.AttrOutcome))
				return
			}
		}
		select {
		case <-deadline:
			t.Fatal("no step span for the cancelled run")
		case <-e.rec.exported:
		}
	}
}

// NATS starts with a traceparent header, request-reply and durable
// envelope, and the Go client's StartByName with a span in its context:
// the run's spans are in the caller's trace. The raw requests send the
// header in lower case, as NATS does not canonicalize header names.
func TestNATSStartTraceparentIsTheRunsTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	send := map[string]func(runID string){
		"request": func(runID string) {
			msg := nats.NewMsg(startproto.AdmitSubjectPrefix + "three")
			msg.Header["traceparent"] = []string{knownHeader}
			msg.Data = []byte(`{"run_id":"` + runID + `","input":1}`)
			ctx, cancel := context.WithTimeout(context.Background(), e.wait)
			defer cancel()
			reply, err := e.nc.RequestMsgWithContext(ctx, msg)
			require.NoError(t, err)
			var r startproto.StartReply
			require.NoError(t, json.Unmarshal(reply.Data, &r))
			require.Nil(t, r.Error)
			require.Equal(t, "created", r.Outcome)
		},
		"envelope": func(runID string) {
			msg := nats.NewMsg(startproto.StartSubjectPrefix + "three")
			msg.Header["traceparent"] = []string{knownHeader}
			msg.Header.Set(nats.MsgIdHdr, runID)
			msg.Data = []byte(`{"run_id":"` + runID + `","input":1}`)
			js, err := e.nc.JetStream()
			require.NoError(t, err)
			_, err = js.PublishMsg(msg)
			require.NoError(t, err)
		},
		"client": func(runID string) {
			ctx, cancel := context.WithTimeout(context.Background(), e.wait)
			defer cancel()
			ctx = trace.ContextWithRemoteSpanContext(ctx, knownParentContext(t))
			res, err := e.client.StartByName(ctx, "three", json.RawMessage("1"), jetflow.WithRunID(runID))
			require.NoError(t, err)
			require.Equal(t, jetflow.OutcomeCreated, res.Outcome)
		},
		// Start admits in the client's process: a client that traces
		// emits the start span.
		"start": func(runID string) {
			ctx, cancel := context.WithTimeout(context.Background(), e.wait)
			defer cancel()
			traced, err := jetflow.NewClient(ctx, e.nc, jetflow.ClientConfig{Tracing: jetflow.WithTracerProvider(e.tp)})
			require.NoError(t, err)
			ctx = trace.ContextWithRemoteSpanContext(ctx, knownParentContext(t))
			h, err := jetflow.Start(ctx, traced, e.three, 1, jetflow.WithRunID(runID))
			require.NoError(t, err)
			require.Equal(t, jetflow.OutcomeCreated, h.Outcome)
		},
	}
	for how, start := range send {
		runID := "nats-" + how
		start(runID)
		spans := e.rec.wait(t, runID, e.wait)
		checkTrace(t, spans, knownParentContext(t))
	}
}

// Tracing off (a nil *Tracer): the hooks on the hot path allocate nothing.
// Not parallel: testing.AllocsPerRun refuses parallel tests.
func TestTracingOffAllocatesNothing(t *testing.T) {
	var off *tracing.Tracer
	require.Nil(t, tracing.New(nil))
	run := &state.Run{RunID: "r", Workflow: "w", Token: "tok", TraceParent: knownHeader}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		sctx, span := off.StartAdmission(ctx, "r", "w", "http")
		_ = tracing.TraceParent(sctx)
		span.End("created", nil)
		step := off.StartStep(run, tracing.StepAttempt{StepID: "r.a.0", Name: "a", Attempt: 1})
		step.TaskKeyHit(false)
		step.End(tracing.StepCommitted, nil)
		off.EndRun(*run)
		off.EndWait(run, tracing.WaitEnd{StepID: "r.nap.0", Name: "nap", Kind: state.StepSleep, Outcome: tracing.WaitSlept})
		dctx, deliver := off.StartDelivery(ctx, time.Time{}, run, tracing.Delivery{Event: "go", EventID: "e"})
		_ = tracing.TraceParent(dctx)
		deliver.Resumed("r.event=go.0")
		deliver.End("delivered", nil)
	})
	require.Zero(t, allocs)
}

// BenchmarkStepSpan is the cost of one step attempt's span: tracing off
// (a nil Tracer), and on with an SDK provider that drops what it records.
func BenchmarkStepSpan(b *testing.B) {
	run := &state.Run{RunID: "r", Workflow: "w", Token: "tok", TraceParent: knownHeader}
	tp := sdktrace.NewTracerProvider(sdktrace.WithIDGenerator(tracing.IDGenerator()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for name, tr := range map[string]*tracing.Tracer{"off": nil, "on": tracing.New(tp)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				span := tr.StartStep(run, tracing.StepAttempt{StepID: "r.a.0", Name: "a", Attempt: 1, Worker: "w1"})
				span.TaskKeyHit(false)
				span.End(tracing.StepCommitted, nil)
			}
		})
	}
}
