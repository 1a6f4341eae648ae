package httpapi

import (
	"errors"
	"net/http"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
)

// RunEndedType is the problem type of a cancel of a run that had already
// completed or failed.
const RunEndedType = DocsURL + "#cancelling-a-run"

// Cancelled is the body of POST /v1/runs/{id}/cancel, and what the
// producer's cancel --output json prints: the run, its status (cancelled),
// whether an earlier call had cancelled it already, and the child runs
// cancelled with it, a list that is empty, never absent or null.
type Cancelled struct {
	RunID            string            `json:"run_id"`
	Status           jetflow.RunStatus `json:"status"`
	AlreadyCancelled bool              `json:"already_cancelled"`
	Children         []string          `json:"children"`
}

// NewCancelled returns the body for a cancel's outcome.
func NewCancelled(out jetflow.CancelOutcome) Cancelled {
	children := out.Children
	if children == nil {
		children = []string{}
	}
	return Cancelled{RunID: out.RunID, Status: out.Status, AlreadyCancelled: out.AlreadyCancelled, Children: children}
}

// runEndedProblem is the 409 problem of a cancel that came too late: the
// problem, and the state the run had ended in (an RFC 9457 extension
// member).
type runEndedProblem struct {
	Problem
	RunStatus jetflow.RunStatus `json:"run_status"`
}

// cancelRun is POST /v1/runs/{id}/cancel: it cancels a running run and its
// attached children. A repeat answers 200 with already_cancelled; a run
// that completed or failed is 409, with its status.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	out, err := s.cfg.Backend.CancelRun(ctx, id)
	switch {
	case errors.Is(err, jetflow.ErrRunEnded):
		w.Header().Set(HeaderRunStatus, string(out.Status))
		p := Problem{Type: RunEndedType, Title: "Run already ended", Status: http.StatusConflict, Detail: err.Error(), RunID: id}
		writeJSON(w, p.Status, "application/problem+json", runEndedProblem{Problem: p, RunStatus: out.Status})
		return
	case err != nil:
		s.fail(w, r, id, err)
		return
	}
	w.Header().Set(HeaderRunStatus, string(out.Status))
	writeJSON(w, http.StatusOK, "application/json", NewCancelled(out))
}
