// Package eventproto is jetflow's NATS event protocol (docs/protocol.md):
// what a client in any language sends to deliver an event into a run, by
// run ID and event name or by hook token, and what it is answered. Workers
// answer on SendSubject (any worker) and on SendSubject.<workflow> (the
// workers of that workflow, which alone can check a payload against the
// event's declared type: a worker that does not serve the run's workflow
// forwards the request there). What a delivery does is decided by
// workflow.Sender.
package eventproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/reqreply"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/internal/workflow"
)

// SendSubject is where any NATS client sends events (request-reply).
// SendSubject + "." + workflow is where a worker forwards a request to the
// workers of the run's workflow.
const SendSubject = "jetflow.events"

// Request is the event envelope.
type Request struct {
	// RunID and Name address the run's wait for the event called Name;
	// Token addresses the wait on a hook. One of the two.
	RunID string `json:"run_id,omitempty"`
	Name  string `json:"name,omitempty"`
	Token string `json:"token,omitempty"`
	// EventID identifies the event: a second delivery with the same ID is
	// a duplicate.
	EventID string          `json:"event_id"`
	Payload json.RawMessage `json:"payload"`
}

// Event is the delivery r asks for.
func (r Request) Event() workflow.Event {
	return workflow.Event{RunID: r.RunID, Name: r.Name, Token: r.Token, ID: r.EventID, Payload: r.Payload}
}

// Reply answers a Request: an outcome, or an error.
type Reply struct {
	// Outcome is OutcomeDelivered or OutcomeDuplicate.
	Outcome  string `json:"outcome,omitempty"`
	RunID    string `json:"run_id,omitempty"`
	Workflow string `json:"workflow,omitempty"`
	// StepID is the wait step that holds the event.
	StepID  string `json:"step_id,omitempty"`
	EventID string `json:"event_id,omitempty"`
	// RunStatus is the run's state when it has ended (CodeRunEnded).
	RunStatus state.Status `json:"run_status,omitempty"`
	Error     *ReplyError  `json:"error,omitempty"`
}

// ReplyError is a typed error in a Reply.
type ReplyError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Outcomes of a delivered event.
const (
	// OutcomeDelivered: the event was recorded in the run, for the wait
	// named by StepID (now or when the body reaches it).
	OutcomeDelivered = "delivered"
	// OutcomeDuplicate: the event ID was delivered before with the same
	// payload; nothing changed.
	OutcomeDuplicate = "duplicate"
)

// Error codes of a Reply. CodeUnavailable and CodeInternal are
// retryable: the event may or may not have been delivered, and a retry
// with the same event ID tells (duplicate). CodeRunNotFound and
// CodeHookNotFound may change while a run is being admitted or has not
// reached its hook wait yet; every other code is final.
const (
	CodeMalformed      = "malformed_request"
	CodeInvalidRunID   = "invalid_run_id"
	CodeInvalidName    = "invalid_name"
	CodeInvalidToken   = "invalid_token"
	CodeInvalidEventID = "invalid_event_id"
	CodeInvalidPayload = "invalid_payload"
	CodeTooLarge       = "payload_too_large"
	CodeUnknownEvent   = "unknown_event"
	CodeRunNotFound    = "run_not_found"
	CodeHookNotFound   = "hook_not_found"
	CodeRunEnded       = "run_ended"
	CodeConflict       = "conflict"
	// CodeUnavailable: no worker serves the run's workflow now; retry.
	CodeUnavailable = "unavailable"
	// CodeInternal: NATS failed on the worker; retry with the same event
	// ID.
	CodeInternal = "internal"
)

// Codes lists every error code a Reply can carry (the reply's JSON Schema
// enumerates the same).
var Codes = []string{CodeMalformed, CodeInvalidRunID, CodeInvalidName, CodeInvalidToken, CodeInvalidEventID,
	CodeInvalidPayload, CodeTooLarge, CodeUnknownEvent, CodeRunNotFound, CodeHookNotFound, CodeRunEnded,
	CodeConflict, CodeUnavailable, CodeInternal}

// errorCodes maps the errors of a delivery to their codes, most specific
// first.
var errorCodes = []struct {
	err  error
	code string
}{
	{state.ErrInputTooLarge, CodeTooLarge},
	{state.ErrInvalidRunID, CodeInvalidRunID},
	{state.ErrInvalidName, CodeInvalidName},
	{state.ErrInvalidHookToken, CodeInvalidToken},
	{state.ErrInvalidEventID, CodeInvalidEventID},
	{workflow.ErrEventPayload, CodeInvalidPayload},
	{workflow.ErrUnknownEvent, CodeUnknownEvent},
	{workflow.ErrRunNotFound, CodeRunNotFound},
	{workflow.ErrHookNotFound, CodeHookNotFound},
	{workflow.ErrRunEnded, CodeRunEnded},
	{workflow.ErrEventConflict, CodeConflict},
	{state.ErrCorrupt, CodeMalformed},
	{workflow.ErrInput, CodeMalformed},
}

// Code is the reply code of a delivery's error err.
func Code(err error) string {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return CodeInternal
}

// ErrorOf is the error a reply's code stands for (the sentinel the Go
// client matches), wrapping the message; nil for CodeUnavailable and
// CodeInternal, which the caller maps to its retryable error.
func ErrorOf(code string) error {
	for _, c := range errorCodes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Decode parses and validates an envelope: one JSON object, known fields
// only, an event ID, a payload (null when absent).
func Decode(b []byte) (workflow.Event, error) {
	var r Request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return workflow.Event{}, fmt.Errorf("%w: event envelope: %w", state.ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return workflow.Event{}, fmt.Errorf("%w: event envelope: data after the JSON object", state.ErrCorrupt)
	}
	if len(r.Payload) == 0 {
		r.Payload = json.RawMessage("null")
	}
	ev := r.Event()
	if r.Token == "" && r.RunID == "" {
		return ev, fmt.Errorf("%w: event envelope names neither run_id and name nor token", state.ErrCorrupt)
	}
	return ev, ev.Validate()
}

// Check decodes the payload of the event name of a workflow into its
// declared type: ErrUnknownEvent when the workflow declares no such event,
// ErrEventPayload when it does not decode.
type Check func(name string, payload json.RawMessage) error

// Service answers event requests for the workflows a worker serves.
type Service struct {
	NC     *nats.Conn
	Sender workflow.Sender
	// Served maps each workflow this worker serves to its events' check.
	Served  map[string]Check
	Timeout time.Duration
	Log     zerolog.Logger
	// Metrics counts the deliveries this worker answers (nil: none).
	Metrics *metrics.Metrics
	// Tracer emits the jetflow.event.deliver span of each delivery this
	// worker answers (nil: none), in the trace of the request's
	// traceparent header.
	Tracer *tracing.Tracer
}

// maxConcurrent bounds the event requests a worker answers at once.
const maxConcurrent = 64

// Serve answers on SendSubject and on SendSubject.<workflow> for each
// served workflow (reqreply.Serve: a request whose reply subject is not an
// inbox is not answered). The returned function stops serving.
func (s *Service) Serve() (func() error, error) {
	subjects := []string{SendSubject}
	for wf := range s.Served {
		subjects = append(subjects, SendSubject+"."+wf)
	}
	return reqreply.Serve(s.NC, "jetflow_events", subjects, maxConcurrent, s.Log, s.answer)
}

// answer handles one request and returns the reply.
func (s *Service) answer(m *nats.Msg) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	defer cancel()
	ctx = tracing.FromNATS(ctx, m.Header) // the sender's trace context, if any
	reply, relayed := s.handle(ctx, m.Data, m.Subject != SendSubject)
	if !relayed { // the workers that answered a forward count it
		s.Metrics.Event(reply.Workflow, outcomeOf(reply))
	}
	if reply.Error != nil {
		ev := s.Log.Info()
		if reply.Error.Code == CodeInternal {
			ev = s.Log.Warn()
		}
		ev.Str("run_id", reply.RunID).Str("code", reply.Error.Code).Str("reason", reply.Error.Message).Msg("event refused")
	}
	b, err := json.Marshal(reply)
	if err != nil { // a reply is plain data: never happens
		b = []byte(`{"error":{"code":"internal","message":"cannot encode the reply"}}`)
	}
	return b
}

// handle delivers the event in b, or, when this worker does not serve the
// run's workflow, forwards it to the workers that do and returns their
// reply (relayed). The worker that answers (not the one that forwards)
// emits the delivery's span.
func (s *Service) handle(ctx context.Context, b []byte, forwarded bool) (_ *Reply, relayed bool) {
	began := time.Now()
	ev, err := Decode(b)
	if err != nil {
		return s.traced(ctx, began, ev, nil, errorReply(ev, err)), false
	}
	t, err := s.Sender.Resolve(ctx, ev)
	if err != nil {
		return s.traced(ctx, began, ev, nil, errorReply(ev, err)), false
	}
	check, ok := s.Served[t.Run.Workflow]
	switch {
	case !ok && forwarded:
		return s.traced(ctx, began, ev, &t.Run, errorReply(ev, fmt.Errorf("jetflow: event forwarded to a worker that does not serve %s", t.Run.Workflow))), false
	case !ok:
		r, relayed := s.forward(ctx, t.Run.Workflow, ev, b)
		return r, relayed
	}
	ctx, span := s.Tracer.StartDelivery(ctx, began, &t.Run, delivery(ev, t.Name))
	ev.TraceParent = tracing.TraceParent(ctx) // the span's, or the sender's when this worker does not trace
	reply := s.deliver(ctx, t, ev, check)
	endDelivery(span, reply)
	return reply, false
}

// deliver checks ev's payload and delivers it to its target t.
func (s *Service) deliver(ctx context.Context, t workflow.Target, ev workflow.Event, check Check) *Reply {
	reply := &Reply{RunID: t.Run.RunID, Workflow: t.Run.Workflow, EventID: ev.ID}
	if err := check(t.Name, ev.Payload); err != nil {
		reply.Error = &ReplyError{Code: Code(err), Message: err.Error()}
		return reply
	}
	d, err := s.Sender.Deliver(ctx, t, ev)
	if err != nil {
		reply.Error = &ReplyError{Code: Code(err), Message: err.Error()}
		if t.Run.Status.Terminal() {
			reply.RunStatus = t.Run.Status
		}
		return reply
	}
	reply.Outcome, reply.StepID = OutcomeDelivered, d.StepID
	if d.Duplicate {
		reply.Outcome = OutcomeDuplicate
	}
	return reply
}

// traced emits the span of a delivery refused before it was tried (run is
// nil when it was refused before its run was found) and returns reply.
func (s *Service) traced(ctx context.Context, began time.Time, ev workflow.Event, run *state.Run, reply *Reply) *Reply {
	if s.Tracer.On() {
		_, span := s.Tracer.StartDelivery(ctx, began, run, delivery(ev, ev.Name))
		endDelivery(span, reply)
	}
	return reply
}

// delivery describes ev, an event called name, for its span.
func delivery(ev workflow.Event, name string) tracing.Delivery {
	return tracing.Delivery{Event: name, EventID: ev.ID, Hook: ev.Token != ""}
}

// endDelivery ends a delivery's span with its reply: the step it resumed
// and its outcome, or its error code, with an error status.
func endDelivery(span tracing.Span, reply *Reply) {
	if !span.Active() {
		return
	}
	span.Resumed(reply.StepID)
	if e := reply.Error; e != nil {
		span.End(e.Code, errors.New(e.Message))
		return
	}
	span.End(reply.Outcome, nil)
}

// forward asks the workers of workflow to deliver the event and relays
// their reply (relayed); with none running it answers CodeUnavailable.
func (s *Service) forward(ctx context.Context, workflow string, ev workflow.Event, b []byte) (_ *Reply, relayed bool) {
	req := nats.NewMsg(SendSubject + "." + workflow)
	req.Data = b
	tracing.InjectNATS(ctx, req.Header) // the sender's trace context, on to the worker that delivers
	m, err := s.NC.RequestMsgWithContext(ctx, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return &Reply{RunID: ev.RunID, Workflow: workflow, EventID: ev.ID,
			Error: &ReplyError{Code: CodeUnavailable, Message: "no worker serves workflow " + workflow + " now"}}, false
	}
	if err != nil {
		return errorReply(ev, fmt.Errorf("jetflow: forward event to workflow %s: %w", workflow, err)), false
	}
	var r Reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return errorReply(ev, fmt.Errorf("jetflow: forwarded event reply: %w", err)), false
	}
	return &r, true
}

// outcomeOf is the metric outcome of reply.
func outcomeOf(r *Reply) string {
	switch {
	case r.Error == nil:
		return r.Outcome
	case r.Error.Code == CodeUnavailable || r.Error.Code == CodeInternal:
		return metrics.EventError
	}
	return metrics.EventRefused
}

func errorReply(ev workflow.Event, err error) *Reply {
	return &Reply{RunID: ev.RunID, EventID: ev.ID, Error: &ReplyError{Code: Code(err), Message: err.Error()}}
}
