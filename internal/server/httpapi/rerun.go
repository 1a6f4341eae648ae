package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/jetflow/jetflow"
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
	const shape = `{"from": "<step>", "run_id": "<id>", "dry_run": true|false}`
	id, req, ok := runOperation[RerunRequest](s, w, r, shape)
	if !ok {
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
