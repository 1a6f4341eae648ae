package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/webhook"
)

// delivery is one webhook request: the provider's headers and body.
type delivery struct {
	header http.Header
	body   string
}

// signed returns a delivery of event id with body, signed by the
// provider of src at ts.
func signed(src webhook.Source, id string, ts time.Time, body string) delivery {
	h := webhook.Sign(src.Provider, src.Secrets[0], id, ts, []byte(body))
	h.Set("Content-Type", "application/json")
	return delivery{header: h, body: body}
}

func (b *bundle) deliver(source string, d delivery) response {
	b.t.Helper()
	return b.do(http.MethodPost, "/v1/webhooks/"+source, d.header, d.body)
}

// requireNoRun fails unless no run has runID.
func (b *bundle) requireNoRun(runID string) {
	b.t.Helper()
	_, err := b.client.GetRun(ctxT(b.t, 10*time.Second), runID)
	require.ErrorIs(b.t, err, jetflow.ErrRunNotFound, "a rejected delivery started run %s", runID)
}

// For each provider: a valid delivery starts the source's workflow under
// "<source>-<event id>"; a tampered or stale one is 401 and starts
// nothing; a re-delivery, re-signed later or with another header, lands on
// the same run.
func TestWebhookDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, src := range testSources {
		{
			t.Logf("provider %s", src.Provider)
			event := func(id string) (string, string) { // event ID, body
				return id, `{"id":"` + id + `","type":"invoice.paid","amount":100}`
			}
			id, body := event("evt_ok_1")
			wantRun := src.Name + "-" + id

			res := b.deliver(src.Name, signed(src, id, testNow, body))
			require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)
			var acc WebhookAccepted
			res.json(t, &acc)
			require.Equal(t, WebhookAccepted{RunID: wantRun, EventID: id, Outcome: "created"}, acc)
			require.Equal(t, "created", res.header.Get(HeaderOutcome))

			run, err := b.client.GetRun(ctxT(t, 10*time.Second), wantRun)
			require.NoError(t, err)
			require.Equal(t, "hook", run.Workflow)
			require.Equal(t, "webhook:"+src.Name+":"+id, run.Source)
			require.JSONEq(t, body, string(run.Input))

			// The provider re-delivers the event after its run ended, signed
			// anew a minute later (and, for GitHub, with the event header
			// this time): the same run, although the workflow's policy
			// would start a new one for an ordinary start.
			b.waitDone(wantRun)
			again := signed(src, id, testNow.Add(time.Minute), body)
			again.header.Set("X-GitHub-Event", "invoice")
			res = b.deliver(src.Name, again)
			require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)
			res.json(t, &acc)
			require.Equal(t, WebhookAccepted{RunID: wantRun, EventID: id, Outcome: "existing"}, acc)
			run, err = b.client.GetRun(ctxT(t, 10*time.Second), wantRun)
			require.NoError(t, err)
			require.Zero(t, run.Generation, "the redelivery must not start the run again")

			// Tampered: the body changed after signing.
			id, body = event("evt_tampered_1")
			d := signed(src, id, testNow, body)
			d.body = strings.Replace(d.body, "100", "999", 1)
			res = b.deliver(src.Name, d)
			require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
			require.Contains(t, res.problem(t).Detail, "signature")
			b.requireNoRun(src.Name + "-" + id)

			// Signed with another secret.
			other := src
			other.Secrets = []string{"whsec_" + "b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA=="}
			res = b.deliver(src.Name, signed(other, id, testNow, body))
			require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
			b.requireNoRun(src.Name + "-" + id)

			if src.Provider != webhook.GitHub { // GitHub signs no timestamp
				id, body = event("evt_stale_1")
				res = b.deliver(src.Name, signed(src, id, testNow.Add(-10*time.Minute), body))
				require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
				b.requireNoRun(src.Name + "-" + id)
			}

			// Unsigned.
			res = b.deliver(src.Name, delivery{header: http.Header{"Content-Type": {"application/json"}}, body: body})
			require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
		}
	}

	// A plain start may not take a run ID of a webhook source's events.
	res := b.post("echo", "stripe-evt_squat", `{"n":1}`)
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "reserved for webhook source stripe")
	b.requireNoRun("stripe-evt_squat")

	// A run ID taken first by another kind of start (here the Go SDK): the
	// event is refused (409, the provider retries and shows it), never
	// taken for the run's forged input.
	_, err := b.client.StartByName(ctxT(t, 10*time.Second), "hook", json.RawMessage(`{"forged":true}`), jetflow.WithRunID("stripe-evt_taken"))
	require.NoError(t, err)
	res = b.deliver("stripe", signed(testSources[2], "evt_taken", testNow, `{"id":"evt_taken","type":"invoice.paid"}`))
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "not by webhook source stripe")

	// A run an earlier version started for an event recorded the source
	// without the event ID: its redelivery still lands on it.
	_, err = b.client.StartByName(ctxT(t, 10*time.Second), "hook", json.RawMessage(`{"id":"evt_legacy"}`),
		jetflow.WithRunID("stripe-evt_legacy"), jetflow.WithSource("webhook:stripe"))
	require.NoError(t, err)
	res = b.deliver("stripe", signed(testSources[2], "evt_legacy", testNow, `{"id":"evt_legacy","type":"invoice.paid"}`))
	require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)
	var acc WebhookAccepted
	res.json(t, &acc)
	require.Equal(t, WebhookAccepted{RunID: "stripe-evt_legacy", EventID: "evt_legacy", Outcome: "existing"}, acc)

	res = b.deliver("nope", signed(testSources[0], "evt_1", testNow, `{}`))
	require.Equal(t, http.StatusNotFound, res.code)
	res.problem(t)

	// Malformed: a Stripe body without an event id.
	res = b.deliver("stripe", signed(testSources[2], "", testNow, `{"type":"x"}`))
	require.Equal(t, http.StatusBadRequest, res.code, "body: %s", res.body)
	res.problem(t)

	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{Workflow: "hook"})
	require.NoError(t, err)
	require.Len(t, page.Runs, len(testSources)+2, "one run per provider's valid event, the forged one and the legacy one, nothing else")
}

// A source set is checked when the server is made.
func TestNewRefusesBadSources(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Backend: &fakeBackend{}, Sources: []webhook.Source{testSources[0], testSources[0]}})
	require.ErrorContains(t, err, "twice")
	bad := testSources[1]
	bad.Secrets = nil
	_, err = New(Config{Backend: &fakeBackend{}, Sources: []webhook.Source{bad}})
	require.ErrorIs(t, err, webhook.ErrInvalidSource)
	_, err = New(Config{})
	require.Error(t, err)
	_, err = New(Config{Backend: &fakeBackend{}, Tokens: []string{" "}})
	require.Error(t, err)
}
