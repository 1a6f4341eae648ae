package httpapi

import (
	"fmt"
	"net/http"
	"strings"

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
	// A redelivery of the event always lands on its run: attach while it
	// runs, return it after it ended, whatever the workflow's own policy
	// (a StartNew policy would process the event twice, a reject policy
	// would make the provider retry until it gives up).
	res, err := s.cfg.Backend.StartByName(ctx, src.Workflow, body,
		jetflow.WithRunID(runID),
		jetflow.WithSource("webhook:"+src.Name),
		jetflow.WithEntryPoint(jetflow.EntryWebhook),
		jetflow.WithFingerprintMode(jetflow.FingerprintIgnore),
		jetflow.WithConflictPolicy(jetflow.ConflictPolicy{WhileRunning: jetflow.Attach, AfterCompleted: jetflow.ReturnExisting, AfterFailed: jetflow.ReturnExisting}))
	if err != nil {
		s.fail(w, r, runID, err)
		return
	}
	startHeaders(w.Header(), res)
	writeJSON(w, http.StatusAccepted, "application/json", WebhookAccepted{RunID: res.RunID, Outcome: string(res.Outcome)})
}

// webhookPrefix reports whether key is in the run ID space of a configured
// webhook source ("<source>-..."), and which.
func (s *Server) webhookPrefix(key string) (string, bool) {
	for name := range s.sources {
		if strings.HasPrefix(key, name+"-") {
			return name, true
		}
	}
	return "", false
}
