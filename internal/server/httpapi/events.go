package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// Problem types of event deliveries (docs/http.md has a section for each).
const (
	// EventConflictType: the event ID was delivered before with another
	// payload, or the hook's single wait has ended.
	EventConflictType = DocsURL + "#event-conflict"
	// EventRunEndedType: the run the event is for has ended.
	EventRunEndedType = DocsURL + "#event-after-the-run-ended"
)

// EventDelivery is the body of a successful POST /v1/runs/{id}/events/{name}
// or POST /v1/hooks/{token}, and what the producer's send and resume print
// with --output json: the outcome (delivered or duplicate) and where the
// event went.
type EventDelivery struct {
	Outcome  jetflow.EventOutcome `json:"outcome"`
	RunID    string               `json:"run_id"`
	Workflow string               `json:"workflow"`
	// StepID is the wait step that holds the event.
	StepID  string `json:"step_id"`
	EventID string `json:"event_id"`
}

// NewEventDelivery returns the body for an event's result.
func NewEventDelivery(res jetflow.EventResult) EventDelivery {
	return EventDelivery{Outcome: res.Outcome, RunID: res.RunID, Workflow: res.Workflow, StepID: res.StepID, EventID: res.EventID}
}

// sendFunc delivers one event: the event ID and payload of the request.
type sendFunc func(ctx context.Context, eventID string, payload json.RawMessage) (jetflow.EventResult, error)

// sendEvent is POST /v1/runs/{id}/events/{name}: it delivers the event
// called name to the run (Client.SendEvent).
func (s *Server) sendEvent(w http.ResponseWriter, r *http.Request) {
	runID, name := r.PathValue("id"), r.PathValue("name")
	if err := state.ValidateRunID(runID); err != nil {
		s.fail(w, r, "", err)
		return
	}
	if err := state.ValidateName(name); err != nil {
		// An invalid event name is a bad request; for a workflow name
		// (the start route) the same error is a 404.
		s.fail(w, r, runID, fmt.Errorf("%w: event name: %w", errBadRequest, err))
		return
	}
	s.deliverEvent(w, r, runID, func(ctx context.Context, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
		return s.cfg.Backend.SendEvent(ctx, runID, name, eventID, payload)
	})
}

// resumeHook is POST /v1/hooks/{token}: it delivers the event to the wait
// on the hook token (Client.Resume).
func (s *Server) resumeHook(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if err := state.ValidateHookToken(token); err != nil {
		s.fail(w, r, "", err)
		return
	}
	s.deliverEvent(w, r, "", func(ctx context.Context, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
		return s.cfg.Backend.Resume(ctx, token, eventID, payload)
	})
}

// deliverEvent reads the event ID (Idempotency-Key) and the payload (the
// body) of an event request, delivers them with send and answers: 200 with
// the outcome for a first delivery and for a duplicate alike (a duplicate
// adds Idempotent-Replayed: true), else a problem. runID is the run the
// request names, "" for a hook.
func (s *Server) deliverEvent(w http.ResponseWriter, r *http.Request, runID string, send sendFunc) {
	eventID, err := parseEventID(r.Header)
	if err != nil {
		s.fail(w, r, runID, err)
		return
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Status: http.StatusUnsupportedMediaType, RunID: runID,
			Detail: "the body is the event's payload and must be JSON: send Content-Type application/json (or none)"})
		return
	}
	payload, err := s.readJSON(w, r)
	if err != nil {
		s.fail(w, r, runID, err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	ctx = tracing.FromHTTP(ctx, r.Header) // traceparent, tracestate: the delivery joins the caller's trace
	res, err := send(ctx, eventID, payload)
	if res.RunID != "" {
		runID = res.RunID // a hook's run, once the workers found it
	}
	switch {
	case errors.Is(err, jetflow.ErrRunEnded):
		eventRunEnded(w, runID, res.RunStatus, err)
		return
	case err != nil:
		s.fail(w, r, runID, err)
		return
	}
	if res.Outcome == jetflow.EventDuplicate {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeJSON(w, http.StatusOK, "application/json", NewEventDelivery(res))
}

// eventRunEnded answers 409 to an event for a run that has ended, with the
// state it ended in.
func eventRunEnded(w http.ResponseWriter, runID string, status jetflow.RunStatus, err error) {
	writeRunStatusProblem(w, Problem{Type: EventRunEndedType, Title: "Run already ended",
		Status: http.StatusConflict, Detail: err.Error(), RunID: runID}, status)
}

// parseEventID returns the event ID the request's Idempotency-Key names:
// a structured-field string or a bare value, 1..256 bytes without control
// characters (state.ValidateEventID). The header is required: without it
// a retry could not be told from a new event. A provider's own delivery
// ID header (webhook-id, X-GitHub-Delivery) is not read: such deliveries
// are signed and go to POST /v1/webhooks/{source}.
func parseEventID(h http.Header) (string, error) {
	v, ok, err := keyHeader(h)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "", fmt.Errorf("%w: no Idempotency-Key header: send the event's ID in it, the same on every retry of the event (a second delivery with that ID is a duplicate)", errBadRequest)
	}
	if err := state.ValidateEventID(v); err != nil {
		return "", fmt.Errorf("%w: header Idempotency-Key: %w", errBadRequest, err)
	}
	return v, nil
}

// keyHeader returns the value of the request's one Idempotency-Key header,
// a structured-field string decoded, with ok false when there is none.
func keyHeader(h http.Header) (v string, ok bool, err error) {
	values := h.Values(HeaderIdempotencyKey)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, fmt.Errorf("%w: %d Idempotency-Key headers, want one", errBadRequest, len(values))
	}
	v = strings.Trim(values[0], " \t")
	if strings.HasPrefix(v, `"`) {
		if v, err = parseSFString(v); err != nil {
			return "", false, fmt.Errorf("%w: Idempotency-Key: %w", errBadRequest, err)
		}
	}
	return v, true, nil
}
