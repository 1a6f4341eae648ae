package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/entry"
	"github.com/jetflow/jetflow/internal/webhook"
)

// WebhookAccepted is the body of an accepted webhook delivery, whether it
// started the run or found it started by an earlier delivery of the event.
type WebhookAccepted struct {
	// RunID is the event's run: webhook.Source.RunID of the event ID.
	RunID string `json:"run_id"`
	// EventID is the provider's event ID as the delivery carried it (bytes
	// that are not UTF-8 replaced by U+FFFD, as JSON needs), which the run
	// ID keeps only when it fits one.
	EventID string `json:"event_id"`
	// Outcome is created, existing or restarted.
	Outcome string `json:"outcome"`
}

// webhook is POST /v1/webhooks/{source}: a delivery is verified with the
// source's scheme and secrets, then starts the source's workflow under the
// event's run ID (webhook.Source.RunID: "<source>-<event id>", or a hash of
// an event ID that cannot be part of a run ID) with the raw body as input
// and the event ID in the run's source (webhook.Source.RunSource). Nothing
// is started for a delivery that does not verify.
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
	res, err := s.cfg.Backend.StartByName(entry.With(ctx, entry.Webhook), src.Workflow, body,
		jetflow.WithRunID(runID),
		jetflow.WithSource(src.RunSource(ev)),
		jetflow.WithFingerprintMode(jetflow.FingerprintIgnore),
		jetflow.WithConflictPolicy(jetflow.ConflictPolicy{WhileRunning: jetflow.Attach, AfterCompleted: jetflow.ReturnExisting, AfterFailed: jetflow.ReturnExisting}))
	if err != nil {
		s.fail(w, r, runID, err)
		return
	}
	if res.Outcome == jetflow.OutcomeExisting {
		// The run ID was already taken: by an earlier delivery of this
		// event, or by a start from elsewhere that named the event's run ID
		// first, whose input the event must not be taken for.
		if err := s.checkWebhookRun(r, src, runID); err != nil {
			s.fail(w, r, runID, err)
			return
		}
	}
	startHeaders(w.Header(), res)
	writeJSON(w, http.StatusAccepted, "application/json", WebhookAccepted{RunID: res.RunID, EventID: ev.ID, Outcome: string(res.Outcome)})
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

// errTakenRunID: a webhook event's run ID names a run that another kind of
// start created.
var errTakenRunID = errors.New("run ID taken")

// checkWebhookRun returns an error matching jetflow.ErrDuplicateRejected
// (409) when the run under the event's run ID was not started by this
// webhook source.
func (s *Server) checkWebhookRun(r *http.Request, src webhook.Source, runID string) error {
	run, err := s.readRun(r, runID)
	if err != nil {
		return err
	}
	if !src.StartedRun(run.Source) {
		s.log.Warn().Str("workflow", run.Workflow).Str("run_id", runID).Str("source", src.Name).Str("run_source", run.Source).
			Msg("httpapi: a webhook event's run ID was taken by another start; the event is refused")
		return fmt.Errorf("%w: %w: run %s was started by %q, not by webhook source %s: the event is not processed", jetflow.ErrDuplicateRejected, errTakenRunID, runID, run.Source, src.Name)
	}
	return nil
}
