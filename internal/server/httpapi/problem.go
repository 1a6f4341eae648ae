package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/server/webhook"
)

// DocsURL is the user documentation of the API; problem types point at its
// sections.
const DocsURL = "https://github.com/jetflow/jetflow/blob/main/docs/http.md"

// RunIDRequiredType is the problem type of a start without an
// Idempotency-Key to a workflow that requires one.
const RunIDRequiredType = DocsURL + "#idempotency-key-required"

// statusClientClosed is the status Observe gets for a request whose client
// went away before it was answered (nginx's 499); nothing is sent.
const statusClientClosed = 499

// Problem is an RFC 9457 problem details object, the body of every error
// response (Content-Type application/problem+json).
type Problem struct {
	// Type is a URI naming the problem; "about:blank" when the status says
	// it all.
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RunID is the run the problem is about, where known.
	RunID string `json:"run_id,omitempty"`
	// Fields are, on a 422 idempotency conflict whose inputs are both JSON
	// objects, the top-level input fields that differ (names and how each
	// changed, never values: jetflow.ConflictError.Fields); MoreFields
	// counts those left out.
	Fields     []jetflow.FieldDiff `json:"fields,omitempty"`
	MoreFields int                 `json:"more_fields,omitempty"`
}

// writeProblem sends p, filling Type and Title from its status.
func writeProblem(w http.ResponseWriter, p Problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	writeJSON(w, p.Status, "application/problem+json", p)
}

// runStatusProblem is a problem about the state a run is in (an event
// after it ended, an unblock of a run not blocked): the problem, and the
// run's status as the extension member run_status, absent when the server
// could not read it.
type runStatusProblem struct {
	Problem
	RunStatus jetflow.RunStatus `json:"run_status,omitempty"`
}

// writeRunStatusProblem sends p with the run's status, in run_status and
// in Jetflow-Run-Status (neither when status is "").
func writeRunStatusProblem(w http.ResponseWriter, p Problem, status jetflow.RunStatus) {
	if status != "" {
		w.Header().Set(HeaderRunStatus, string(status))
	}
	writeJSON(w, p.Status, "application/problem+json", runStatusProblem{Problem: p, RunStatus: status})
}

// writeJSON sends v as JSON with code. Payloads (inputs, outputs) are
// written as stored: no HTML escaping.
func writeJSON(w http.ResponseWriter, code int, contentType string, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Every value sent is built from decoded JSON and plain fields;
		// failing here is a bug, reported without the value.
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Internal Server Error","status":500}` + "\n"))
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes()) // the client went away: nothing to do
}

// errorStatuses maps the errors a handler can meet to their status, first
// match wins: more specific sentinels come before the ones they wrap.
var errorStatuses = []struct {
	err    error
	status int
}{
	{jetflow.ErrIdempotencyConflict, http.StatusUnprocessableEntity},
	{jetflow.ErrDuplicateRejected, http.StatusConflict},
	{jetflow.ErrRunIDRequired, http.StatusBadRequest},
	// Workers of the deployment run and none has ever served a workflow
	// of that name: a client error, 404. A known workflow whose workers
	// are all down or restarting (a rollout), and any workflow while no
	// worker of the deployment runs (a fresh deployment whose workers
	// start after the API), is ErrNoWorker, which matches ErrUnavailable
	// below: 503 with Retry-After, so that the client retries instead of
	// dropping the start.
	{jetflow.ErrUnknownWorkflow, http.StatusNotFound},
	{jetflow.ErrRunNotFound, http.StatusNotFound},
	// Events (POST /v1/runs/{id}/events/{name}, /v1/hooks/{token}). A
	// payload that does not decode into the event's type is a 400 as a
	// start's undecodable input is; an event the run's workflow does not
	// declare, a 422 as a key naming a run of another workflow is.
	{jetflow.ErrHookNotFound, http.StatusNotFound},
	{jetflow.ErrEventConflict, http.StatusConflict},
	{jetflow.ErrRunEnded, http.StatusConflict},
	// An unblock of a run that is not blocked (its handler adds the run's
	// status), or that accepts a divergence naming no step to waive.
	{jetflow.ErrRunNotBlocked, http.StatusConflict},
	{jetflow.ErrNothingToWaive, http.StatusUnprocessableEntity},
	// A rerun of a run that has not ended (its handler adds the run's
	// status), or from a step the run never reached.
	{jetflow.ErrRunNotEnded, http.StatusConflict},
	{jetflow.ErrStepNotReached, http.StatusUnprocessableEntity},
	{jetflow.ErrUnknownEvent, http.StatusUnprocessableEntity},
	{jetflow.ErrEventPayload, http.StatusBadRequest},
	{jetflow.ErrInvalidEventID, http.StatusBadRequest},
	{jetflow.ErrInvalidHookToken, http.StatusBadRequest},
	{jetflow.ErrInputTooLarge, http.StatusRequestEntityTooLarge},
	{jetflow.ErrInvalidInput, http.StatusBadRequest},
	{jetflow.ErrInvalidListOptions, http.StatusBadRequest},
	{jetflow.ErrInvalidKey, http.StatusBadRequest},
	{jetflow.ErrInvalidRunID, http.StatusBadRequest},
	{jetflow.ErrInvalidAttributes, http.StatusBadRequest},
	{errBadRequest, http.StatusBadRequest},
	// A workflow name that is not a valid name names no workflow.
	{jetflow.ErrInvalidName, http.StatusNotFound},
	{webhook.ErrMalformed, http.StatusBadRequest},
	{webhook.ErrMissingHeader, http.StatusUnauthorized},
	{webhook.ErrBadSignature, http.StatusUnauthorized},
	{webhook.ErrStaleTimestamp, http.StatusUnauthorized},
	// The NATS user of producer serve may not make a write the request
	// needs (a cancel as jetflow_producer): not retryable, not a bug.
	{jetflow.ErrPermissionDenied, http.StatusForbidden},
	// NATS or JetStream cannot serve the request now (down, reconnecting,
	// a timeout, no leader): 503 with Retry-After, so that the client
	// retries, a start with the same key. jetstream.IsTransient decides.
	{jetflow.ErrUnavailable, http.StatusServiceUnavailable},
}

// errBadRequest is matched by the request errors the handlers find
// themselves (a bad header, query parameter or body).
var errBadRequest = errors.New("bad request")

// statusOf is the HTTP status for err. A transient NATS error that reached
// here unmarked (from a Backend other than *jetflow.Client) is classified
// as jetflow's client does.
func statusOf(err error) int {
	err = jetstream.Unavailable(err)
	for _, e := range errorStatuses {
		if errors.Is(err, e.err) {
			return e.status
		}
	}
	return http.StatusInternalServerError
}

// fail answers err as a problem about runID (which may be empty). A
// request whose client has gone away gets nothing. Server-side failures
// are logged with the route, never with the request's payload.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, runID string, err error) {
	if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		return // the client went away; Observe reports 499
	}
	p := Problem{Status: statusOf(err), Detail: err.Error(), RunID: runID}
	switch p.Status {
	case http.StatusBadRequest:
		if errors.Is(err, jetflow.ErrRunIDRequired) {
			p.Type = RunIDRequiredType
			p.Title = "Idempotency-Key required"
			w.Header().Set("Link", "<"+RunIDRequiredType+`>; rel="describedby"`)
		}
	case http.StatusUnprocessableEntity:
		var ce *jetflow.ConflictError
		if errors.As(err, &ce) {
			p.Fields, p.MoreFields = ce.Fields, ce.MoreFields
		}
		switch {
		case errors.Is(err, jetflow.ErrNothingToWaive):
			p.Type, p.Title = NothingToWaiveType, "Nothing to waive"
		case errors.Is(err, jetflow.ErrStepNotReached):
			p.Type, p.Title = RerunType, "Step not reached"
		}
	case http.StatusConflict:
		switch {
		case errors.Is(err, jetflow.ErrEventConflict):
			p.Type, p.Title = EventConflictType, "Event conflict"
		case errors.Is(err, jetflow.ErrRunNotEnded):
			p.Type, p.Title = RerunType, "Run not ended"
		}
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	}
	if p.Status >= 500 {
		ev := s.log.Error().Str("route", r.Pattern).Int("status", p.Status).Err(err)
		if id := RequestID(r.Context()); id != "" {
			ev = ev.Str("request_id", id)
		}
		if runID != "" { // a failure before the run ID is known names none, not ""
			ev = ev.Str("run_id", runID)
		}
		ev.Msg("httpapi: request failed")
	}
	writeProblem(w, p)
}
