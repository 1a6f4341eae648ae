package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/internal/testsupport/webhooktest"
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

	// Listed once every run has ended: a listing misses a record that is
	// written while it reads the bucket (Client.ListRuns walks the keys
	// with a watcher; a run index replaces it).
	for _, id := range []string{"stripe-evt_taken", "stripe-evt_legacy"} {
		_, err := b.client.WaitRun(ctxT(t, 10*time.Second), id)
		require.NoError(t, err)
	}
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

// TestWebhookOfficialLibraries delivers, over HTTP, every delivery the
// providers' own libraries signed and judged (internal/testsupport/webhooktest:
// standardwebhooks, @octokit/webhooks-methods, stripe-go), each to a source
// of its own holding the secrets the official verifier held. What the
// official verifier accepts starts exactly one run, also when four copies
// arrive at once, under the event's run ID — an event ID with '.' or ':' or
// too long for a run ID included — and the reply and the run keep the
// original event ID; what it refuses is 400 or 401 and stores nothing.
func TestWebhookOfficialLibraries(t *testing.T) {
	t.Parallel()
	cases, err := webhooktest.All()
	require.NoError(t, err)
	b := setup(t)

	// One API server per verifier clock (each fixture file's),
	// with a source per case.
	servers := map[time.Time]*httptest.Server{}
	sources := map[time.Time][]webhook.Source{}
	for i, c := range cases {
		sources[c.Now] = append(sources[c.Now], webhook.Source{Name: fmt.Sprintf("c%d", i), Provider: webhook.Provider(c.Provider), Workflow: "hook", Secrets: c.Secrets})
	}
	for now, srcs := range sources {
		s, err := New(Config{Backend: b.client, Sources: srcs, Now: func() time.Time { return now }, Logger: testenv.Logger(t)})
		require.NoError(t, err)
		servers[now] = httptest.NewServer(s)
		t.Cleanup(servers[now].Close)
	}

	accepted := 0
	for i, c := range cases {
		src := webhook.Source{Name: fmt.Sprintf("c%d", i), Provider: webhook.Provider(c.Provider), Workflow: "hook", Secrets: c.Secrets}
		runID, err := src.RunID(webhook.Event{ID: c.EventID})
		require.NoError(t, err)
		deliver := func() response {
			return doCtx(t, ctxT(t, 30*time.Second), servers[c.Now], http.MethodPost, "/v1/webhooks/"+src.Name, c.Header, string(c.Body))
		}
		if want, _ := c.JetflowAccepts(); !want {
			res := deliver()
			require.Contains(t, []int{http.StatusBadRequest, http.StatusUnauthorized}, res.code, "%s/%s: %s", c.Provider, c.Name, res.body)
			res.problem(t)
			b.requireNoRun(runID)
			continue
		}
		accepted++
		const copies = 4
		replies := make(chan response, copies)
		for range copies {
			go func() { replies <- deliver() }()
		}
		outcomes := map[string]int{}
		for range copies {
			res := <-replies
			require.Equal(t, http.StatusAccepted, res.code, "%s/%s: %s", c.Provider, c.Name, res.body)
			var acc WebhookAccepted
			res.json(t, &acc)
			require.Equal(t, runID, acc.RunID, "%s/%s", c.Provider, c.Name)
			require.Equal(t, c.EventID, acc.EventID, "the reply carries the original event ID")
			outcomes[acc.Outcome]++
		}
		require.Equal(t, map[string]int{"created": 1, "existing": copies - 1}, outcomes, "%s/%s", c.Provider, c.Name)
		run, err := b.client.GetRun(ctxT(t, 10*time.Second), runID)
		require.NoError(t, err)
		require.Equal(t, src.RunSource(webhook.Event{ID: c.EventID}), run.Source)
		if len(run.Source) < state.MaxSourceLen {
			require.Equal(t, "webhook:"+src.Name+":"+c.EventID, run.Source, "the run keeps the original event ID")
		}
		require.JSONEq(t, string(c.Body), string(run.Input))
	}
	require.Positive(t, accepted)
	page, err := b.client.ListRuns(ctxT(t, 10*time.Second), jetflow.ListOptions{Workflow: "hook", Limit: jetflow.MaxListLimit})
	require.NoError(t, err)
	require.Len(t, page.Runs, accepted, "one run per accepted event, none for a refused one")
}

// paidEvent is what the payment workflow reads of a Stripe event.
type paidEvent struct {
	ID   string `json:"id"`
	Data struct {
		Object struct {
			Amount int `json:"amount"`
		} `json:"object"`
	} `json:"data"`
}

// paySource resumes the hook order-<order id>-payment for Stripe's
// payment_intent.succeeded; other event types start "hook".
func paySource(t *testing.T) webhook.Source {
	t.Helper()
	tpl, err := webhook.ParseTokenTemplate("order-{data.object.metadata.order_id}-payment")
	require.NoError(t, err)
	return webhook.Source{Name: "pay", Provider: webhook.Stripe, Workflow: "hook", Secrets: []string{webhooktest.StripeSecret},
		Resume: []webhook.Resume{{Type: "payment_intent.succeeded", Token: tpl}}}
}

// stripeDelivery is a Stripe event of type typ about order, signed at ts
// with webhooktest.StripeSecret by webhook.Sign, which writes the header
// stripe-go's GenerateTestSignedPayload writes (checked in the checks
// module: checks/webhook, TestSignIsStripeGos).
func stripeDelivery(id, typ, order string, ts time.Time) delivery {
	body := `{"id":"` + id + `","object":"event","type":"` + typ + `","data":{"object":{"object":"payment_intent","amount":1999,"metadata":{"order_id":"` + order + `"}}}}`
	h := webhook.Sign(webhook.Stripe, webhooktest.StripeSecret, id, ts, []byte(body))
	h.Set("Content-Type", "application/json")
	return delivery{header: h, body: body}
}

// servePayments starts a second worker on b's server, serving "payorder":
// it waits on the hook order-<input>-payment and returns the event's ID
// and amount.
func (b *bundle) servePayments() {
	b.t.Helper()
	ws := jetflow.NewRegistry()
	require.NoError(b.t, ws.Register(jetflow.NewWorkflow("payorder", func(ctx *jetflow.Context, order string) (string, error) {
		ev, err := jetflow.WaitEvent[paidEvent](ctx, "paid", jetflow.WithHookToken("order-"+order+"-payment"))
		return fmt.Sprintf("%s:%d", ev.ID, ev.Data.Object.Amount), err
	}, jetflow.WithEvent[paidEvent]("paid"))))
	runWorker(b.t, b.ns, ws, jetflow.WorkerConfig{})
}

// A configured resume rule: a Stripe payment_intent.succeeded event
// resumes the hook its body names (template
// order-{data.object.metadata.order_id}-payment), once. Before the run
// waits, and for a token no run waits on, the provider gets 404 and
// nothing is stored (its retry delivers the event later); ten concurrent
// redeliveries are duplicates; another event for the ended wait is 409; a
// body without the field is 422; an event of another type starts the
// source's workflow as before.
func TestWebhookResumesHook(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Sources = append(append([]webhook.Source{}, testSources...), paySource(t)) })
	b.servePayments()
	ctx := ctxT(t, 60*time.Second)
	const typ = "payment_intent.succeeded"

	// The event arrives before the run waits: 404, nothing stored.
	first := stripeDelivery("evt_pay_1", typ, "o-1", testNow)
	res := b.deliver("pay", first)
	require.Equal(t, http.StatusNotFound, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "order-o-1-payment")
	b.requireNoRun("pay-evt_pay_1")

	_, err := b.client.StartByName(ctx, "payorder", json.RawMessage(`"o-1"`), jetflow.WithRunID("payrun-1"))
	require.NoError(t, err)
	b.waitHook("order-o-1-payment")

	// The provider's retry: delivered into the run's wait.
	res = b.deliver("pay", first)
	require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
	var got WebhookResumed
	res.json(t, &got)
	require.Equal(t, "delivered", got.Outcome)
	require.Equal(t, "order-o-1-payment", got.Token)
	require.Equal(t, "payrun-1", got.RunID)
	require.Equal(t, "payorder", got.Workflow)
	require.Equal(t, "evt_pay_1", got.EventID)
	require.Contains(t, got.StepID, "payrun-1.hook=paid.")
	run, err := b.client.WaitRun(ctx, "payrun-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.JSONEq(t, `"evt_pay_1:1999"`, string(run.Output))

	// Ten redeliveries at once, signed anew: duplicates, nothing changes.
	const copies = 10
	replies := make(chan response, copies)
	for range copies {
		go func() { replies <- b.deliver("pay", stripeDelivery("evt_pay_1", typ, "o-1", testNow.Add(time.Minute))) }()
	}
	for range copies {
		res := <-replies
		require.Equal(t, http.StatusOK, res.code, "body: %s", res.body)
		var dup WebhookResumed
		res.json(t, &dup)
		require.Equal(t, WebhookResumed{Outcome: "duplicate", Token: got.Token, RunID: got.RunID, Workflow: got.Workflow, StepID: got.StepID, EventID: got.EventID}, dup)
	}
	again, err := b.client.GetRun(ctx, "payrun-1")
	require.NoError(t, err)
	require.Equal(t, run.Output, again.Output)

	// Another payment event for the same order: the hook was used.
	res = b.deliver("pay", stripeDelivery("evt_pay_2", typ, "o-1", testNow))
	require.Equal(t, http.StatusConflict, res.code, "body: %s", res.body)
	res.problem(t)

	// A token no run ever waits on: 404, no run.
	res = b.deliver("pay", stripeDelivery("evt_pay_3", typ, "o-none", testNow))
	require.Equal(t, http.StatusNotFound, res.code, "body: %s", res.body)
	b.requireNoRun("pay-evt_pay_3")

	// A body that gives no token: 422.
	res = b.deliver("pay", stripeDelivery("evt_pay_4", typ, "o.4", testNow))
	require.Equal(t, http.StatusUnprocessableEntity, res.code, "body: %s", res.body)
	require.Contains(t, res.problem(t).Detail, "data.object.metadata.order_id")

	// An event of another type starts the workflow, as without rules.
	res = b.deliver("pay", stripeDelivery("evt_pay_5", "payment_intent.created", "o-1", testNow))
	require.Equal(t, http.StatusAccepted, res.code, "body: %s", res.body)
	var acc WebhookAccepted
	res.json(t, &acc)
	require.Equal(t, WebhookAccepted{RunID: "pay-evt_pay_5", EventID: "evt_pay_5", Outcome: "created"}, acc)

	// A tampered delivery resumes nothing: 401 before any token is read.
	tampered := stripeDelivery("evt_pay_6", typ, "o-1", testNow)
	tampered.body = strings.Replace(tampered.body, "1999", "1", 1)
	res = b.deliver("pay", tampered)
	require.Equal(t, http.StatusUnauthorized, res.code, "body: %s", res.body)
}

// Every status a resume can answer is documented for the webhook route.
func TestWebhookResumeStatusesDocumented(t *testing.T) {
	t.Parallel()
	codes := documentedCodes(t)["POST /v1/webhooks/{source}"]
	require.True(t, codes["200"], "a resumed hook")
	for _, e := range resumeStatuses {
		require.True(t, codes[fmt.Sprint(e.status)], "status %d (for %v) is not documented for webhooks", e.status, e.err)
	}
}
