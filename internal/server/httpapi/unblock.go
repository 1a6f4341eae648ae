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
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Status: http.StatusUnsupportedMediaType, RunID: id,
			Detail: `the body is JSON ({"accept_divergence": true}, or none): send Content-Type application/json (or none)`})
		return
	}
	req, err := s.readUnblock(w, r)
	if err != nil {
		s.fail(w, r, id, err)
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

// readUnblock reads an unblock's body: none (or white space) is the zero
// request; a body that is not that JSON object, or names a field it does
// not have (a misspelt accept_divergence must not unblock without
// accepting), is a bad request.
func (s *Server) readUnblock(w http.ResponseWriter, r *http.Request) (UnblockRequest, error) {
	var req UnblockRequest
	body, err := s.readBody(w, r)
	if err != nil || len(bytes.Trim(body, jsonSpace)) == 0 {
		return req, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf(`%w: the body is not {"accept_divergence": true|false}: %w`, errBadRequest, err)
	}
	if dec.More() {
		return req, fmt.Errorf("%w: the body holds more than one JSON value", errBadRequest)
	}
	return req, nil
}
