// Package webhooktest holds webhook deliveries signed, and verdicts given,
// by the providers' own libraries, for tests of jetflow's verifier
// (internal/server/webhook) and of its HTTP route (internal/server/httpapi):
//
//   - Standard Webhooks and GitHub: testdata/official.json, written by
//     testdata/generate.mjs with the npm packages standardwebhooks and
//     @octokit/webhooks-methods (CI does not run npm; the script says how
//     to regenerate the file);
//   - Stripe: testdata/stripe.json, signed and judged by stripe-go's
//     webhook package in the checks module (checks/webhook), whose test
//     signs the same deliveries again and fails unless stripe-go still
//     gives the file's signatures and verdicts; `go test ./webhook
//     -update` in checks/ writes it anew. stripe-go is thus in the checks
//     module's build only, not in jetflow's module graph.
//
// It does not import package webhook, so that package's own tests can use
// it. Only tests import it.
package webhooktest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
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

// Stripe secrets of the Stripe cases: the current one, a rotated (older)
// one, and one the verifier does not hold.
const (
	StripeSecret        = "whsec_jetflow_fixture_stripe_current"
	StripeRotatedSecret = "whsec_jetflow_fixture_stripe_rotated"
	StripeWrongSecret   = "whsec_jetflow_fixture_stripe_wrong"
)

//go:embed testdata/stripe.json
var stripeJSON []byte

// StripeFile is the layout of testdata/stripe.json: Stripe deliveries
// signed with stripe-go at Now (Unix seconds), each with stripe-go's
// verdict at that time (webhook.ValidatePayloadWithTolerance,
// DefaultTolerance, with any of the case's secrets). The checks module
// writes it and checks it against stripe-go (checks/webhook).
type StripeFile struct {
	GeneratedBy string            `json:"generated_by"`
	Versions    map[string]string `json:"versions"`
	Now         int64             `json:"now"`
	Stripe      []StripeCase      `json:"stripe"`
}

// StripeCase is one delivery of testdata/stripe.json: the secrets the
// verifier held, the Stripe-Signature header, the body sent, and
// stripe-go's verdict. The event ID is the body's id.
type StripeCase struct {
	Name      string   `json:"name"`
	Secrets   []string `json:"secrets"`
	Signature string   `json:"stripe_signature"`
	Body      string   `json:"body"`
	Accepted  bool     `json:"accepted"`
}

// Case returns c as a Case judged at now.
func (c StripeCase) Case(now time.Time) (Case, error) {
	var ev struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(c.Body), &ev); err != nil {
		return Case{}, fmt.Errorf("webhooktest: Stripe case %q: body: %w", c.Name, err)
	}
	return Case{
		Provider: "stripe", Name: c.Name, Secrets: c.Secrets, Header: http.Header{"Stripe-Signature": {c.Signature}},
		Body: []byte(c.Body), Now: now.UTC(), Accepted: c.Accepted, EventID: ev.ID,
	}, nil
}

// StripeCases returns the cases of testdata/stripe.json, or an error if
// the file does not decode.
func StripeCases() ([]Case, error) {
	var f StripeFile
	if err := json.Unmarshal(stripeJSON, &f); err != nil {
		return nil, fmt.Errorf("webhooktest: testdata/stripe.json: %w", err)
	}
	if len(f.Stripe) == 0 {
		return nil, fmt.Errorf("webhooktest: testdata/stripe.json has no cases")
	}
	out := make([]Case, 0, len(f.Stripe))
	for _, c := range f.Stripe {
		cc, err := c.Case(time.Unix(f.Now, 0))
		if err != nil {
			return nil, err
		}
		out = append(out, cc)
	}
	return out, nil
}

// All returns Fixtures and StripeCases together.
func All() ([]Case, error) {
	cases, err := Fixtures()
	if err != nil {
		return nil, err
	}
	stripe, err := StripeCases()
	if err != nil {
		return nil, err
	}
	return append(cases, stripe...), nil
}
