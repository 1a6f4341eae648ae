// Package webhooktest holds webhook deliveries signed, and verdicts given,
// by the providers' own libraries, for tests of jetflow's verifier
// (internal/server/webhook) and of its HTTP route (internal/server/httpapi):
//
//   - Standard Webhooks and GitHub: testdata/official.json, written by
//     testdata/generate.mjs with the npm packages standardwebhooks and
//     @octokit/webhooks-methods (CI does not run npm; the script says how
//     to regenerate the file);
//   - Stripe: built at run time with stripe-go's webhook package.
//
// It does not import package webhook, so that package's own tests can use
// it. Only tests import it: stripe-go is linked into no binary.
package webhooktest

import (
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	stripewebhook "github.com/stripe/stripe-go/v84/webhook"
)

// Case is one delivery and the official verifier's verdict on it.
type Case struct {
	// Provider is "standard", "github" or "stripe", as webhook.Provider.
	Provider string
	Name     string
	// Secrets are the secrets the official verifier held (it accepts the
	// delivery if any one of them verifies it).
	Secrets []string
	Header  http.Header
	Body    []byte
	// Now is the official verifier's clock.
	Now time.Time
	// Accepted is the official verifier's verdict.
	Accepted bool
	// EventID is the delivery's event ID: webhook-id, X-GitHub-Delivery,
	// or the Stripe body's id.
	EventID string
}

// differences are the official cases where jetflow's verdict is knowingly
// not the official verifier's: jetflow's verdict, and why.
var differences = map[string]struct {
	accepted bool
	why      string
}{
	"github/upper-case hex":   {true, "hex is case-insensitive (compared in constant time as bytes); @octokit compares the header as a string"},
	"stripe/future timestamp": {false, "jetflow refuses a timestamp beyond the tolerance in the future too; stripe-go checks only the past"},
}

// JetflowAccepts is whether jetflow's verifier must accept c: the official
// verdict, except for the few deliberate differences, and whether c is one
// of them.
func (c Case) JetflowAccepts() (accepted, differs bool) {
	if d, ok := differences[c.Provider+"/"+c.Name]; ok {
		return d.accepted, true
	}
	return c.Accepted, false
}

//go:embed testdata/official.json
var officialJSON []byte

// fixtureFile is the layout of testdata/official.json.
type fixtureFile struct {
	Now      int64           `json:"now"`
	Standard []fixtureCase   `json:"standard"`
	GitHub   []fixtureCase   `json:"github"`
	Versions json.RawMessage `json:"versions"`
}

type fixtureCase struct {
	Name     string            `json:"name"`
	Secrets  []string          `json:"secrets"`
	Headers  map[string]string `json:"headers"`
	Body     string            `json:"body"`
	Accepted bool              `json:"accepted"`
}

// Fixtures returns the cases of testdata/official.json, Standard
// Webhooks' then GitHub's, or an error if the file does not decode.
func Fixtures() ([]Case, error) {
	var f fixtureFile
	if err := json.Unmarshal(officialJSON, &f); err != nil {
		return nil, fmt.Errorf("webhooktest: testdata/official.json: %w", err)
	}
	var out []Case
	for _, set := range []struct {
		provider, idHeader string
		cases              []fixtureCase
	}{{"standard", "webhook-id", f.Standard}, {"github", "x-github-delivery", f.GitHub}} {
		if len(set.cases) == 0 {
			return nil, fmt.Errorf("webhooktest: testdata/official.json has no %s cases", set.provider)
		}
		for _, c := range set.cases {
			h := http.Header{}
			for k, v := range c.Headers {
				h.Set(k, v)
			}
			out = append(out, Case{
				Provider: set.provider, Name: c.Name, Secrets: c.Secrets, Header: h, Body: []byte(c.Body),
				Now: time.Unix(f.Now, 0).UTC(), Accepted: c.Accepted, EventID: c.Headers[set.idHeader],
			})
		}
	}
	return out, nil
}

// Stripe secrets of StripeCases: the current one, a rotated (older) one,
// and one the verifier does not hold.
const (
	StripeSecret        = "whsec_jetflow_fixture_stripe_current"
	StripeRotatedSecret = "whsec_jetflow_fixture_stripe_rotated"
	stripeWrongSecret   = "whsec_jetflow_fixture_stripe_wrong"
)

// StripeCases returns Stripe deliveries signed with stripe-go at times
// around the wall clock, each with stripe-go's verdict
// (webhook.ValidatePayloadWithTolerance, DefaultTolerance, with any of the
// case's secrets) and Now set to the clock it was given against.
func StripeCases() []Case {
	now := time.Now().Truncate(time.Second)
	body := func(id string) []byte {
		return []byte(`{"id":"` + id + `","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":100}}}`)
	}
	v1 := func(secret string, ts time.Time, b []byte) string {
		return "v1=" + hex.EncodeToString(stripewebhook.ComputeSignature(ts, b, secret))
	}
	type spec struct {
		name    string
		id      string
		ts      time.Time
		secrets []string // the verifier's
		header  func(t string, b []byte) string
		sent    func(b []byte) []byte
	}
	ts := now.Add(-30 * time.Second)
	plain := func(t string, b []byte) string { return t + "," + v1(StripeSecret, ts, b) }
	specs := []spec{
		{name: "signed by GenerateTestSignedPayload", id: "evt_1NG8Du2eZvKYlo2C", header: func(_ string, b []byte) string {
			return stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: b, Secret: StripeSecret, Timestamp: ts}).Header
		}},
		{name: "event ID with dot and colon", id: "evt.2024:a/b", header: plain},
		{name: "event ID too long for a run ID", id: "evt_" + strings.Repeat("x", 250), header: plain},
		{name: "rotation: old and new signatures, verifier has the new secret", id: "evt_rot_1", header: func(t string, b []byte) string {
			return t + "," + v1(StripeRotatedSecret, ts, b) + "," + v1(StripeSecret, ts, b)
		}},
		{name: "rotation: signed with the old secret, verifier has both", id: "evt_rot_2", secrets: []string{StripeSecret, StripeRotatedSecret},
			header: func(t string, b []byte) string { return t + "," + v1(StripeRotatedSecret, ts, b) }},
		{name: "v1 not hex before a valid one", id: "evt_badhex_1", header: func(t string, b []byte) string {
			return t + ",v1=xyz," + v1(StripeSecret, ts, b) + ",v1=abc"
		}},
		{name: "v0 beside a valid v1", id: "evt_v0_1", header: func(t string, b []byte) string {
			return t + ",v0=" + strings.Repeat("00", 32) + "," + v1(StripeSecret, ts, b)
		}},
		{name: "only a v1 that is not hex", id: "evt_badhex_2", header: func(t string, _ []byte) string { return t + ",v1=xyz" }},
		{name: "element without =", id: "evt_noeq_1", header: func(t string, b []byte) string { return plain(t, b) + ",v1" }},
		{name: "tampered body", id: "evt_tampered_1", header: plain,
			sent: func(b []byte) []byte { return []byte(strings.Replace(string(b), "100", "999", 1)) }},
		{name: "wrong secret", id: "evt_wrong_1", secrets: []string{stripeWrongSecret}, header: plain},
		{name: "future timestamp", id: "evt_future_1", ts: now.Add(stripewebhook.DefaultTolerance + time.Minute), header: func(t string, b []byte) string {
			return t + "," + v1(StripeSecret, now.Add(stripewebhook.DefaultTolerance+time.Minute), b)
		}},
		{name: "timestamp with a leading zero", id: "evt_zero_1", header: func(t string, b []byte) string {
			return "t=0" + strings.TrimPrefix(t, "t=") + "," + v1(StripeSecret, ts, b)
		}},
		{name: "stale timestamp", id: "evt_stale_1", ts: now.Add(-stripewebhook.DefaultTolerance - time.Minute), header: func(t string, b []byte) string {
			return t + "," + v1(StripeSecret, now.Add(-stripewebhook.DefaultTolerance-time.Minute), b)
		}},
	}
	out := make([]Case, 0, len(specs))
	for _, s := range specs {
		at := ts
		if !s.ts.IsZero() {
			at = s.ts
		}
		secrets := s.secrets
		if secrets == nil {
			secrets = []string{StripeSecret}
		}
		b := body(s.id)
		header := s.header(fmt.Sprintf("t=%d", at.Unix()), b)
		sent := b
		if s.sent != nil {
			sent = s.sent(b)
		}
		accepted := false
		for _, secret := range secrets {
			if stripewebhook.ValidatePayloadWithTolerance(sent, header, secret, stripewebhook.DefaultTolerance) == nil {
				accepted = true
			}
		}
		out = append(out, Case{
			Provider: "stripe", Name: s.name, Secrets: secrets, Header: http.Header{"Stripe-Signature": {header}},
			Body: sent, Now: now.UTC(), Accepted: accepted, EventID: s.id,
		})
	}
	return out
}

// All returns Fixtures and StripeCases together.
func All() ([]Case, error) {
	cases, err := Fixtures()
	if err != nil {
		return nil, err
	}
	return append(cases, StripeCases()...), nil
}
