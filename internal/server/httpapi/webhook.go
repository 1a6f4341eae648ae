package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/entry"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/tracing"
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
	// Outcome is created, existing, restarted or superseded.
	Outcome string `json:"outcome"`
}

// webhook is POST /v1/webhooks/{source}: a delivery is verified with the
// source's scheme and secrets; an event whose type has a resume rule
// resumes a hook (resumeHook), any other starts the source's workflow under the
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
	if rule, ok := src.ResumeFor(ev); ok {
		s.resumeFromWebhook(w, r, rule, ev, body)
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
		jetflow.WithAttributes(src.AttributesOf(body)),
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

// WebhookResumed is the body of a webhook delivery that resumed a hook:
// this delivery recorded the event (delivered), or an earlier delivery of
// it did (duplicate).
type WebhookResumed struct {
	// Outcome is delivered or duplicate.
	Outcome string `json:"outcome"`
	// Token is the hook token the source's template derived from the
	// event.
	Token string `json:"token"`
	// RunID, Workflow and StepID name the run and its wait that hold the
	// event.
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	StepID   string `json:"step_id"`
	// EventID is the provider's event ID, the event's ID in the run.
	EventID string `json:"event_id"`
}

// resumeStatuses map the errors of a resume to the answer a provider gets,
// first match wins; any other error is answered by fail (503 for
// ErrUnavailable, so that the provider retries).
var resumeStatuses = []struct {
	err    error
	status int
}{
	// No run waits on the token yet (the event came before the run
	// reached its wait), or none ever will: nothing is stored, and the
	// provider retries a non-2xx answer on its schedule, which delivers
	// the event once the run waits. Not a 5xx: the server is fine.
	{jetflow.ErrHookNotFound, http.StatusNotFound},
	// The hook's wait already ended (another event, a timeout), or its
	// run did: final, the event is not processed.
	{jetflow.ErrEventConflict, http.StatusConflict},
	{jetflow.ErrRunEnded, http.StatusConflict},
	{webhook.ErrNoToken, http.StatusUnprocessableEntity},
	{jetflow.ErrInvalidHookToken, http.StatusUnprocessableEntity},
	{jetflow.ErrUnknownEvent, http.StatusUnprocessableEntity},
	{jetflow.ErrEventPayload, http.StatusUnprocessableEntity},
	{jetflow.ErrInvalidEventID, http.StatusBadRequest},
	{jetflow.ErrInputTooLarge, http.StatusRequestEntityTooLarge},
}

// resumeFromWebhook delivers a verified event to the hook whose token rule
// derives from body, with the provider's event ID and the body as payload.
// A redelivery of the event is a duplicate (200 again); see resumeStatuses
// for the rest.
func (s *Server) resumeFromWebhook(w http.ResponseWriter, r *http.Request, rule webhook.Resume, ev webhook.Event, body []byte) {
	out, token, err := s.resume(r, rule, ev, body)
	if err == nil {
		writeJSON(w, http.StatusOK, "application/json", WebhookResumed{Outcome: string(out.Outcome), Token: token,
			RunID: out.RunID, Workflow: out.Workflow, StepID: out.StepID, EventID: out.EventID})
		return
	}
	for _, e := range resumeStatuses {
		if errors.Is(err, e.err) {
			if e.status == http.StatusConflict || e.status == http.StatusUnprocessableEntity {
				s.log.Warn().Str("route", r.Pattern).Int("status", e.status).Str("event_type", ev.Type).Err(err).
					Msg("httpapi: a webhook event cannot resume its hook; the event is not processed")
			}
			writeProblem(w, Problem{Status: e.status, Detail: err.Error(), RunID: out.RunID})
			return
		}
	}
	s.fail(w, r, out.RunID, err)
}

// resume derives the token of ev from body and resumes its hook.
func (s *Server) resume(r *http.Request, rule webhook.Resume, ev webhook.Event, body []byte) (jetflow.EventResult, string, error) {
	token, err := rule.Token.Token(body)
	if err != nil {
		return jetflow.EventResult{}, "", err
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	ctx = tracing.FromHTTP(ctx, r.Header) // the delivery joins the caller's trace, if it sent one
	// A redelivery of an event the run took is a duplicate, even after the
	// run ended (the engine looks for it before refusing an ended run).
	out, err := s.cfg.Backend.Resume(ctx, token, ev.ID, body)
	return out, token, err
}
