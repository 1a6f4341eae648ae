package jetflow

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/jetflow/jetflow/internal/tracing"
)

// Tracing makes a worker or a client emit OpenTelemetry spans
// (WorkerConfig.Tracing, ClientConfig.Tracing); nil emits none. Make it
// with WithTracerProvider. The spans (docs/tracing.md):
//
//   - jetflow.start: the admission of a start, a child of the span in the
//     start's context (Start, StartByName: ctx; HTTP and NATS: the W3C
//     traceparent and tracestate headers);
//   - jetflow.run: the run, from its creation to its end, emitted by the
//     worker that records the end;
//   - jetflow.step: one attempt of a step, a child of the run's span.
//
// A run carries its start's trace context whether or not the process that
// admitted it traces, so a worker that traces puts the run's spans in the
// caller's trace.
type Tracing struct {
	tracer *tracing.Tracer
}

// WithTracerProvider returns the Tracing that emits jetflow's spans through
// tp. For the jetflow.run span to be the parent of its step spans (which
// are exported before it), tp must give it the span ID derived from the
// run: build an SDK provider with
// sdktrace.WithIDGenerator(jetflow.TraceIDGenerator()). A nil tp, or the
// OpenTelemetry no-op provider, traces nothing.
func WithTracerProvider(tp trace.TracerProvider) *Tracing {
	return &Tracing{tracer: tracing.New(tp)}
}

// TraceIDGenerator is the span ID generator a TracerProvider given to
// WithTracerProvider needs (sdktrace.WithIDGenerator): random IDs, except
// for a jetflow.run span, whose ID is derived from the run's identity.
func TraceIDGenerator() IDGenerator { return tracing.IDGenerator() }

// IDGenerator is the OpenTelemetry SDK's span ID generator interface
// (sdktrace.IDGenerator in go.opentelemetry.io/otel/sdk/trace), declared
// by jetflow so that a program that traces nothing does not build the SDK.
// A value of it is what sdktrace.WithIDGenerator takes.
type IDGenerator = tracing.Generator

// internal returns the tracer of t; nil (no spans) for a nil t.
func (t *Tracing) internal() *tracing.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}
