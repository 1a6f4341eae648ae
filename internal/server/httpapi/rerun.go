package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
)

// RerunType is the problem type of a rerun refused for its source: a run
// that has not ended (409), a step the run never reached (422).
const RerunType = DocsURL + "#rerunning-a-run"

// RerunRequest is the body of POST /v1/runs/{id}/rerun; an empty body is
// the zero value (a rerun from where the run stopped, under its default
// run ID).
type RerunRequest struct {
	// From is the source run's first step to run again: a step name, or
	// a step ID of the run (jetflow.RerunOptions.From).
	From string `json:"from"`
	// RunID is the rerun's run ID (default jetflow.RerunID).
	RunID string `json:"run_id"`
	// DryRun plans the rerun and starts nothing.
	DryRun bool `json:"dry_run"`
}

// rerunSource is the source the audits name for a rerun asked over HTTP,
// as for a start.
const rerunSource = "http"

// rerunRun is POST /v1/runs/{id}/rerun: it starts a new run of the ended
// run that takes its committed steps before from as committed and runs
// the rest again (Client.Rerun), or with dry_run only plans it. 201 when
// this request created the rerun, 200 for a plan or a rerun that existed
// (a repeat); a run that has not ended is 409 with its status, a step it
// never reached 422.
func (s *Server) rerunRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Status: http.StatusUnsupportedMediaType, RunID: id,
			Detail: `the body is JSON ({"from": "<step>", "run_id": "<id>", "dry_run": true}, or none): send Content-Type application/json (or none)`})
		return
	}
	req, err := s.readRerun(w, r)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	res, err := s.cfg.Backend.Rerun(ctx, id, jetflow.RerunOptions{From: req.From, RunID: req.RunID, DryRun: req.DryRun, Source: rerunSource})
	switch {
	case errors.Is(err, jetflow.ErrRunNotEnded):
		writeRunStatusProblem(w, Problem{Type: RerunType, Title: "Run not ended",
			Status: http.StatusConflict, Detail: err.Error(), RunID: id}, s.activeStatus(ctx, id))
		return
	case err != nil: // a step never reached is 422, typed by fail
		s.fail(w, r, id, err)
		return
	}
	code := http.StatusOK
	if res.Start != nil && res.Start.Outcome == jetflow.OutcomeCreated {
		code = http.StatusCreated
		w.Header().Set("Location", runLinks(res.RunID).Run)
	}
	writeJSON(w, code, "application/json", res)
}

// activeStatus is the status of the run runID that a rerun found not
// ended (running or blocked), "" when it cannot be read or the run has
// ended since: the problem then claims no status.
func (s *Server) activeStatus(ctx context.Context, runID string) jetflow.RunStatus {
	run, err := s.cfg.Backend.GetRun(ctx, runID)
	if err != nil || !run.Status.Active() {
		return ""
	}
	return run.Status
}

// readRerun reads a rerun's body: none (or white space) is the zero
// request; a body that is not that JSON object, or names a field it does
// not have (a misspelt dry_run must not start the rerun), is a bad
// request.
func (s *Server) readRerun(w http.ResponseWriter, r *http.Request) (RerunRequest, error) {
	var req RerunRequest
	body, err := s.readBody(w, r)
	if err != nil || len(bytes.Trim(body, jsonSpace)) == 0 {
		return req, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf(`%w: the body is not {"from": "<step>", "run_id": "<id>", "dry_run": true|false}: %w`, errBadRequest, err)
	}
	if dec.More() {
		return req, fmt.Errorf("%w: the body holds more than one JSON value", errBadRequest)
	}
	return req, nil
}
