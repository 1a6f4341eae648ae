package httpapi

import (
	"fmt"
	"net/http"

	"github.com/jetflow/jetflow"
)

// WebhookAccepted is the body of an accepted webhook delivery, whether it
// started the run or found it started by an earlier delivery of the event.
type WebhookAccepted struct {
	RunID string `json:"run_id"`
	// Outcome is created, existing or restarted.
	Outcome string `json:"outcome"`
}

// webhook is POST /v1/webhooks/{source}: a delivery is verified with the
// source's scheme and secrets, then starts the source's workflow under the
// run ID "<source>-<event id>" with the raw body as input. Nothing is
// started for a delivery that does not verify.
func (s *Server) webhook(w http.ResponseWriter, r *http.Request) {
	src, ok := s.sources[r.PathValue("source")]
	if !ok {
		writeProblem(w, Problem{Status: http.StatusNotFound, Detail: fmt.Sprintf("no webhook source %q is configured", clip(r.PathValue("source")))})
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	ev, err := src.Verify(r.Header, body, s.cfg.Now())
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	runID, err := src.RunID(ev)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	res, err := s.cfg.Backend.StartByName(ctx, src.Workflow, body,
		jetflow.WithRunID(runID),
		jetflow.WithSource("webhook:"+src.Name),
		jetflow.WithEntryPoint(jetflow.EntryWebhook),
		jetflow.WithFingerprintMode(jetflow.FingerprintIgnore))
	if err != nil {
		s.fail(w, r, runID, err)
		return
	}
	w.Header().Set(HeaderOutcome, string(res.Outcome))
	w.Header().Set(HeaderRunStatus, string(res.Status))
	writeJSON(w, http.StatusAccepted, "application/json", WebhookAccepted{RunID: res.RunID, Outcome: string(res.Outcome)})
}
