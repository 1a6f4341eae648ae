package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
)

// Problem types of an unblock (docs/http.md has a section for each).
const (
	// RunNotBlockedType: the run is not blocked (running, a repeat of an
	// unblock, or ended).
	RunNotBlockedType = DocsURL + "#unblocking-a-run"
	// NothingToWaiveType: accept_divergence for a block that names no
	// step of the history to go on without.
	NothingToWaiveType = DocsURL + "#accepting-a-divergence"
)

// UnblockRequest is the body of POST /v1/runs/{id}/unblock; an empty body
// is the zero value (replay with the workers' code).
type UnblockRequest struct {
	// AcceptDivergence waives the history's step at the place the block
	// names, so that the code's step there runs, again: its side effects
	// repeat (jetflow.UnblockOptions).
	AcceptDivergence bool `json:"accept_divergence"`
}

// Unblocked is the body of a successful POST /v1/runs/{id}/unblock, and
// what the producer's unblock --output json prints: the run, its status
// (running) and the step of its history waived (absent for none).
type Unblocked struct {
	RunID  string            `json:"run_id"`
	Status jetflow.RunStatus `json:"status"`
	Waived string            `json:"waived,omitempty"`
}

// NewUnblocked returns the body for an unblock's outcome.
func NewUnblocked(out jetflow.UnblockOutcome) Unblocked {
	return Unblocked{RunID: out.RunID, Status: out.Status, Waived: out.Waived}
}

// unblockRun is POST /v1/runs/{id}/unblock: it makes a blocked run go on
// (Client.UnblockRun), replayed with the workers' code, or with
// accept_divergence past the history's step its block names. A run that
// is not blocked is 409 with its status, a block with no step to waive
// 422.
func (s *Server) unblockRun(w http.ResponseWriter, r *http.Request) {
	id, req, ok := runOperation[UnblockRequest](s, w, r, `{"accept_divergence": true|false}`)
	if !ok {
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	out, err := s.cfg.Backend.UnblockRun(ctx, id, jetflow.UnblockOptions{AcceptDivergence: req.AcceptDivergence})
	switch {
	case errors.Is(err, jetflow.ErrRunNotBlocked):
		writeRunStatusProblem(w, Problem{Type: RunNotBlockedType, Title: "Run not blocked",
			Status: http.StatusConflict, Detail: err.Error(), RunID: id}, out.Status)
		return
	case err != nil:
		s.fail(w, r, id, err)
		return
	}
	w.Header().Set(HeaderRunStatus, string(out.Status))
	writeJSON(w, http.StatusOK, "application/json", NewUnblocked(out))
}

// runOperation reads the request of an operation on the run named by the
// path's {id}, with an optional JSON body of options T (shape, for the
// messages): an invalid run ID is 400; a Content-Type other than JSON
// (none is accepted) 415; a body that is not one JSON object of T's
// fields (a misspelt field must not be taken for an absent one) 400; no
// body (or white space) the zero T. ok is false when it answered.
func runOperation[T any](s *Server, w http.ResponseWriter, r *http.Request, shape string) (id string, opts T, ok bool) {
	id = r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return id, opts, false
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Status: http.StatusUnsupportedMediaType, RunID: id,
			Detail: "the body is JSON (" + shape + ", or none): send Content-Type application/json (or none)"})
		return id, opts, false
	}
	body, err := s.readBody(w, r)
	if err == nil && len(bytes.Trim(body, jsonSpace)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err = dec.Decode(&opts); err != nil {
			err = fmt.Errorf("%w: the body is not %s: %w", errBadRequest, shape, err)
		} else if dec.More() {
			err = fmt.Errorf("%w: the body holds more than one JSON value", errBadRequest)
		}
	}
	if err != nil {
		s.fail(w, r, id, err)
		return id, opts, false
	}
	return id, opts, true
}
