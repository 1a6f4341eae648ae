// Package tracing emits jetflow's OpenTelemetry spans and carries the W3C
// trace context of a start into its run.
//
// Five spans, with stable names (docs/tracing.md):
//
//   - jetflow.start: the admission of one start, in the process that admits
//     it, a child of the span the start came with (an HTTP or NATS
//     traceparent header, or the Go client's context).
//   - jetflow.run: the run, from its creation to its end. It begins in one
//     process and ends in another, so it is emitted once, by the process
//     that records the run's end (a worker, or the client that cancels it),
//     with the run's creation time as its start. Its
//     span ID is derived from the run's identity (RunSpanID), so that step
//     spans, exported long before it, name it as their parent.
//   - jetflow.step: one attempt of a step, a child of the run span.
//   - jetflow.wait: one wait of a run (a sleep, an event or hook wait, a
//     child run), from when the body began it to the commit that ended it,
//     a child of the run span. It is emitted once, by the holder that is
//     the first to pass the await that decides on the wait (EndWait).
//   - jetflow.event.deliver: the delivery of an event, by the worker that
//     commits it, a child of the span the event came with, linked to the
//     run's span.
//
// The run record and its tasks carry the start's trace context as a
// traceparent string (state.Run.TraceParent, state.Task.TraceParent): the
// jetflow.start span's when the admitting process traces, the caller's
// otherwise, so a trace is carried through processes that do not trace.
//
// A nil *Tracer traces nothing and costs one nil check: tracing is off
// unless a TracerProvider is configured.
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jetflow/jetflow/internal/state"
)

// Span names.
const (
	SpanStart   = "jetflow.start"
	SpanRun     = "jetflow.run"
	SpanStep    = "jetflow.step"
	SpanWait    = "jetflow.wait"
	SpanDeliver = "jetflow.event.deliver"
)

// EventDelivered is the span event of a jetflow.wait span that an event
// ended: at the event's commit, with its ID.
const EventDelivered = "event delivered"

// ScopeName is the instrumentation scope of jetflow's spans.
const ScopeName = "github.com/jetflow/jetflow"

// Span attributes.
const (
	AttrRunID      = attribute.Key("jetflow.run_id")
	AttrWorkflow   = attribute.Key("jetflow.workflow")
	AttrEntry      = attribute.Key("jetflow.entry")
	AttrOutcome    = attribute.Key("jetflow.outcome")
	AttrGeneration = attribute.Key("jetflow.generation")
	AttrStatus     = attribute.Key("jetflow.status")
	AttrStepID     = attribute.Key("jetflow.step_id")
	AttrStep       = attribute.Key("jetflow.step")
	AttrAttempt    = attribute.Key("jetflow.attempt")
	AttrWorker     = attribute.Key("jetflow.worker")
	AttrTaskKeyHit = attribute.Key("jetflow.task_key_hit")
	// Of jetflow.wait and jetflow.event.deliver spans.
	AttrWaitKind    = attribute.Key("jetflow.wait.kind")
	AttrEvent       = attribute.Key("jetflow.event")
	AttrEventID     = attribute.Key("jetflow.event_id")
	AttrHookToken   = attribute.Key("jetflow.wait.hook_token")
	AttrUntil       = attribute.Key("jetflow.wait.until")
	AttrEarly       = attribute.Key("jetflow.wait.early")
	AttrChildRunID  = attribute.Key("jetflow.child_run_id")
	AttrChildStatus = attribute.Key("jetflow.child_status")
)

// Wait outcomes (AttrOutcome of a jetflow.wait span).
const (
	WaitEvent        = "event"         // an event (or a hook's resume) ended it
	WaitTimeout      = "timeout"       // its timeout passed first
	WaitSlept        = "slept"         // a sleep's deadline passed
	WaitChildEnded   = "child_ended"   // the child run ended (AttrChildStatus says how)
	WaitHookTaken    = "hook_taken"    // another wait held the hook token
	WaitChildRefused = "child_refused" // the child run could not be started
)

// Step outcomes (AttrOutcome of a jetflow.step span).
const (
	StepCommitted = "committed"
	StepRetried   = "retried"
	StepFailed    = "failed"
	// StepReleased: the attempt committed nothing and its task was handed
	// back (the worker stopping, a NATS error); StepDropped: the run was
	// cancelled or the task was not the step's to run.
	StepReleased = "released"
	StepDropped  = "dropped"
)

// Tracer emits jetflow's spans through a TracerProvider. A nil *Tracer
// emits nothing.
type Tracer struct {
	t trace.Tracer
}

// New returns a Tracer over tp; nil (tracing off) when tp is nil or the
// OpenTelemetry no-op provider.
func New(tp trace.TracerProvider) *Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName)}
}

// Span is a span in progress; the zero Span (tracing off) does nothing.
type Span struct {
	s trace.Span
}

// Active reports whether the span records (tracing is on).
func (s Span) Active() bool { return s.s != nil }

// End ends the span with outcome as its AttrOutcome, and err, when not nil,
// as its error status.
func (s Span) End(outcome string, err error) {
	if s.s == nil {
		return
	}
	if outcome != "" {
		s.s.SetAttributes(AttrOutcome.String(outcome))
	}
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// StartAdmission starts the jetflow.start span of the start of runID, a
// child of the span in ctx, and returns ctx with it (TraceParent(ctx) then
// names it).
func (t *Tracer) StartAdmission(ctx context.Context, runID, workflow, entry string) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	if entry == "" {
		entry = "sdk" // as the starts metric counts it
	}
	ctx, s := t.t.Start(ctx, SpanStart, trace.WithAttributes(
		AttrRunID.String(runID), AttrWorkflow.String(workflow), AttrEntry.String(entry)))
	return ctx, Span{s: s}
}

// StepAttempt describes one attempt of a step, for its span.
type StepAttempt struct {
	StepID  string
	Name    string
	Attempt int
	Worker  string
	Start   time.Time
}

// StartStep starts the jetflow.step span of an attempt of a step of run,
// a child of the run's span.
func (t *Tracer) StartStep(run *state.Run, a StepAttempt) Span {
	if t == nil {
		return Span{}
	}
	_, self := runSpan(run)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), self)
	_, s := t.t.Start(ctx, SpanStep, trace.WithTimestamp(a.Start), trace.WithAttributes(
		AttrRunID.String(run.RunID), AttrWorkflow.String(run.Workflow), AttrStepID.String(a.StepID),
		AttrStep.String(a.Name), AttrAttempt.Int(a.Attempt), AttrWorker.String(a.Worker)))
	return Span{s: s}
}

// WaitEnd describes a wait of a run that has ended, for its span.
type WaitEnd struct {
	StepID string
	Name   string
	// Kind is state.StepSleep, state.StepEvent, state.StepHook or
	// state.WaitChild; Event the event waited for, HookToken whether the
	// wait had a hook token, Child the child's run ID.
	Kind      string
	Event     string
	HookToken bool
	Child     string
	// Since is when the wait began, Ended when it ended (its record's
	// commit), Until its deadline (zero: none). Early: the record was
	// committed before the body reached the wait (Ended is Since then).
	Since, Ended, Until time.Time
	Early               bool
	// Outcome is one of the Wait outcomes; ChildStatus how the child
	// ended; Error the message of an outcome that is an error (hook
	// taken, child refused).
	Outcome     string
	ChildStatus string
	Error       string
	// EventID is the event that ended it; Delivery the traceparent of its
	// delivery (state.Step.TraceParent), linked from the span.
	EventID  string
	Delivery string
	Worker   string
}

// EndWait emits the jetflow.wait span of a wait of run that has ended: a
// child of the run's span, from w.Since to w.Ended, with a span event
// EventDelivered at the event's commit and a link to its delivery. Call
// it once per wait.
func (t *Tracer) EndWait(run *state.Run, w WaitEnd) {
	if t == nil {
		return
	}
	_, self := runSpan(run)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), self)
	attrs := []attribute.KeyValue{
		AttrRunID.String(run.RunID), AttrWorkflow.String(run.Workflow), AttrStepID.String(w.StepID),
		AttrStep.String(w.Name), AttrWaitKind.String(w.Kind), AttrOutcome.String(w.Outcome),
		AttrWorker.String(w.Worker),
	}
	if w.Event != "" {
		attrs = append(attrs, AttrEvent.String(w.Event), AttrHookToken.Bool(w.HookToken))
	}
	if w.EventID != "" {
		attrs = append(attrs, AttrEventID.String(w.EventID))
	}
	if !w.Until.IsZero() {
		attrs = append(attrs, AttrUntil.String(w.Until.UTC().Format(time.RFC3339Nano)))
	}
	if w.Early {
		attrs = append(attrs, AttrEarly.Bool(true))
	}
	if w.Child != "" {
		attrs = append(attrs, AttrChildRunID.String(w.Child))
	}
	if w.ChildStatus != "" {
		attrs = append(attrs, AttrChildStatus.String(w.ChildStatus))
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(w.Since), trace.WithAttributes(attrs...)}
	if sc, ok := Parse(w.Delivery); ok {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, s := t.t.Start(ctx, SpanWait, opts...)
	if w.EventID != "" {
		s.AddEvent(EventDelivered, trace.WithTimestamp(w.Ended), trace.WithAttributes(AttrEventID.String(w.EventID)))
	}
	if w.Error != "" {
		s.SetStatus(codes.Error, w.Error)
	}
	s.End(trace.WithTimestamp(w.Ended))
}

// Delivery describes the delivery of an event, for its span: the event's
// name (for a hook, the event its wait waits for), ID, and whether it was
// addressed by a hook token.
type Delivery struct {
	Event   string
	EventID string
	Hook    bool
}

// StartDelivery starts the jetflow.event.deliver span of the delivery of
// an event to run, begun at began, a child of the span in ctx, linked to
// run's span, and returns ctx with it. run is nil when the event was
// refused before its run was found.
func (t *Tracer) StartDelivery(ctx context.Context, began time.Time, run *state.Run, d Delivery) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	attrs := []attribute.KeyValue{AttrEventID.String(d.EventID), AttrHookToken.Bool(d.Hook)}
	if d.Event != "" {
		attrs = append(attrs, AttrEvent.String(d.Event))
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(began), trace.WithSpanKind(trace.SpanKindServer)}
	if run != nil {
		_, self := runSpan(run)
		attrs = append(attrs, AttrRunID.String(run.RunID), AttrWorkflow.String(run.Workflow))
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: self}))
	}
	ctx, s := t.t.Start(ctx, SpanDeliver, append(opts, trace.WithAttributes(attrs...))...)
	return ctx, Span{s: s}
}

// Resumed names, on a jetflow.event.deliver span, the wait step that
// holds the event.
func (s Span) Resumed(stepID string) {
	if s.s != nil && stepID != "" {
		s.s.SetAttributes(AttrStepID.String(stepID))
	}
}

// On reports whether t traces (a nil Tracer does not).
func (t *Tracer) On() bool { return t != nil }

// TaskKeyHit marks a step span whose result was served from its task key.
func (s Span) TaskKeyHit(hit bool) {
	if s.s != nil {
		s.s.SetAttributes(AttrTaskKeyHit.Bool(hit))
	}
}

// RunContext returns ctx with run's jetflow.run span as its remote parent,
// for what the run starts (its child runs, whose spans join its trace).
// A run without a trace context, when tracing is off, leaves ctx as it is.
func (t *Tracer) RunContext(ctx context.Context, run *state.Run) context.Context {
	if t == nil && run.TraceParent == "" {
		return ctx
	}
	_, self := runSpan(run)
	return trace.ContextWithRemoteSpanContext(ctx, self)
}

// EndRun emits the jetflow.run span of run, which has just ended: from its
// creation to its last update, with the span ID RunSpanID derives, so that
// its step spans are its children. A failed run's span has an error status.
// Call it once per run: from the write that recorded the end.
func (t *Tracer) EndRun(run state.Run) {
	if t == nil {
		return
	}
	parent, self := runSpan(&run)
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx = context.WithValue(ctx, forcedKey{}, self)
	_, s := t.t.Start(ctx, SpanRun, trace.WithTimestamp(run.CreatedAt), trace.WithAttributes(
		AttrRunID.String(run.RunID), AttrWorkflow.String(run.Workflow), AttrGeneration.Int(run.Generation),
		AttrStatus.String(string(run.Status))))
	if run.Status == state.StatusFailed && run.Error != nil {
		s.SetStatus(codes.Error, run.Error.Message)
	}
	s.End(trace.WithTimestamp(run.UpdatedAt))
}

// runSpan returns the span context of run's jetflow.run span (self) and
// of its parent: the span of the run's trace context (invalid for a run
// started without one, whose run span is the root of a trace whose ID is
// derived from the run's identity).
func runSpan(run *state.Run) (parent, self trace.SpanContext) {
	parent, ok := Parse(run.TraceParent)
	tid, flags := parent.TraceID(), parent.TraceFlags()
	if !ok {
		sum := sha256.Sum256([]byte("trace/" + run.RunID + "/" + run.Token))
		copy(tid[:], sum[:16])
		flags = trace.FlagsSampled
	}
	self = trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: RunSpanID(run.RunID, run.Token), TraceFlags: flags, Remote: true,
	})
	return parent, self
}

// RunSpanID is the span ID of the jetflow.run span of the run created by
// the start with token: the first 8 bytes of SHA-256(runID "/" token),
// never zero. Every process computes it from the run record alone.
func RunSpanID(runID, token string) trace.SpanID {
	sum := sha256.Sum256([]byte(runID + "/" + token))
	var id trace.SpanID
	copy(id[:], sum[:8])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// TraceParent is the W3C traceparent of the span context in ctx, "" when
// ctx holds none.
func TraceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// Parse decodes a W3C traceparent; ok is false when it is empty or
// malformed (a malformed trace context is ignored, never an error).
func Parse(traceparent string) (sc trace.SpanContext, ok bool) {
	if traceparent == "" {
		return trace.SpanContext{}, false
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), mapCarrier{"traceparent": traceparent})
	sc = trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}

// FromHTTP returns ctx with the trace context of h's traceparent and
// tracestate headers as its remote parent; ctx unchanged when there is
// none or it is malformed.
func FromHTTP(ctx context.Context, h http.Header) context.Context {
	if len(h.Values("Traceparent")) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h))
}

// FromNATS is FromHTTP for a NATS message's headers (names matched without
// regard to case, as NATS header names are not canonicalized).
func FromNATS(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	c := natsCarrier(h)
	if c.Get("traceparent") == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, c)
}

// InjectNATS sets the traceparent and tracestate headers of h from the
// span context in ctx (nothing when it holds none).
func InjectNATS(ctx context.Context, h nats.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagation.TraceContext{}.Inject(ctx, natsCarrier(h))
	}
}

type mapCarrier map[string]string

func (c mapCarrier) Get(key string) string { return c[key] }
func (c mapCarrier) Set(key, value string) { c[key] = value }
func (c mapCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

type natsCarrier nats.Header

func (c natsCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (c natsCarrier) Set(key, value string) { c[key] = []string{value} }

func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// forcedKey carries, in the context of the run span's start, the span
// context IDGenerator gives it.
type forcedKey struct{}

// IDGenerator returns the span ID generator a TracerProvider needs for
// jetflow.run spans to keep their derived IDs (RunSpanID), so that step
// spans exported before it name it as parent: random IDs for every other
// span. Pass it with sdktrace.WithIDGenerator; a provider without it gives
// the run span a random ID (the run's steps then name a parent the backend
// never receives).
func IDGenerator() Generator { return idGenerator{} }

// Generator is the SDK's IDGenerator interface (sdktrace.IDGenerator),
// declared here so that the engine, which only makes spans, does not
// build the SDK: a Generator is what sdktrace.WithIDGenerator takes (the
// otlp package checks it at compile time).
type Generator interface {
	// NewIDs returns a new trace ID and the span ID of its root span.
	NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID)
	// NewSpanID returns a span ID for a span of traceID.
	NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID
}

type idGenerator struct{}

// NewIDs returns the forced IDs of a root run span, random ones otherwise.
func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := ctx.Value(forcedKey{}).(trace.SpanContext); ok {
		return sc.TraceID(), sc.SpanID()
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid, randomSpanID()
}

// NewSpanID returns the forced span ID of a run span, a random one
// otherwise.
func (idGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if sc, ok := ctx.Value(forcedKey{}).(trace.SpanContext); ok && sc.TraceID() == traceID {
		return sc.SpanID()
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
