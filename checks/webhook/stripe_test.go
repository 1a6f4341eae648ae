package webhook

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	stripewebhook "github.com/stripe/stripe-go/v84/webhook"

	jetflowwebhook "github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/testsupport/webhooktest"
)

var update = flag.Bool("update", false, "write internal/testsupport/webhooktest/testdata/stripe.json from stripe-go")

// stripeFile is the fixture the root module's tests read (embedded by
// webhooktest), from this package's directory.
const stripeFile = "../../internal/testsupport/webhooktest/testdata/stripe.json"

const stripeModule = "github.com/stripe/stripe-go/v84"

// stripeCases returns the Stripe deliveries signed with stripe-go at times
// around now, each with stripe-go's verdict
// (webhook.ValidatePayloadWithTolerance, DefaultTolerance, with any of the
// case's secrets). stripe-go judges against the wall clock, so the verdicts
// are stripe-go's for now only when now is the wall clock; the signatures
// and bodies depend on now alone.
func stripeCases(now time.Time) []webhooktest.StripeCase {
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
	const (
		current = webhooktest.StripeSecret
		rotated = webhooktest.StripeRotatedSecret
	)
	ts := now.Add(-30 * time.Second)
	plain := func(t string, b []byte) string { return t + "," + v1(current, ts, b) }
	specs := []spec{
		{name: "signed by GenerateTestSignedPayload", id: "evt_1NG8Du2eZvKYlo2C", header: func(_ string, b []byte) string {
			return stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: b, Secret: current, Timestamp: ts}).Header
		}},
		{name: "event ID with dot and colon", id: "evt.2024:a/b", header: plain},
		{name: "event ID too long for a run ID", id: "evt_" + strings.Repeat("x", 250), header: plain},
		{name: "rotation: old and new signatures, verifier has the new secret", id: "evt_rot_1", header: func(t string, b []byte) string {
			return t + "," + v1(rotated, ts, b) + "," + v1(current, ts, b)
		}},
		{name: "rotation: signed with the old secret, verifier has both", id: "evt_rot_2", secrets: []string{current, rotated},
			header: func(t string, b []byte) string { return t + "," + v1(rotated, ts, b) }},
		{name: "v1 not hex before a valid one", id: "evt_badhex_1", header: func(t string, b []byte) string {
			return t + ",v1=xyz," + v1(current, ts, b) + ",v1=abc"
		}},
		{name: "v0 beside a valid v1", id: "evt_v0_1", header: func(t string, b []byte) string {
			return t + ",v0=" + strings.Repeat("00", 32) + "," + v1(current, ts, b)
		}},
		{name: "only a v1 that is not hex", id: "evt_badhex_2", header: func(t string, _ []byte) string { return t + ",v1=xyz" }},
		{name: "element without =", id: "evt_noeq_1", header: func(t string, b []byte) string { return plain(t, b) + ",v1" }},
		{name: "tampered body", id: "evt_tampered_1", header: plain,
			sent: func(b []byte) []byte { return []byte(strings.Replace(string(b), "100", "999", 1)) }},
		{name: "wrong secret", id: "evt_wrong_1", secrets: []string{webhooktest.StripeWrongSecret}, header: plain},
		{name: "future timestamp", id: "evt_future_1", ts: now.Add(stripewebhook.DefaultTolerance + time.Minute), header: func(t string, b []byte) string {
			return t + "," + v1(current, now.Add(stripewebhook.DefaultTolerance+time.Minute), b)
		}},
		{name: "timestamp with a leading zero", id: "evt_zero_1", header: func(t string, b []byte) string {
			return "t=0" + strings.TrimPrefix(t, "t=") + "," + v1(current, ts, b)
		}},
		{name: "stale timestamp", id: "evt_stale_1", ts: now.Add(-stripewebhook.DefaultTolerance - time.Minute), header: func(t string, b []byte) string {
			return t + "," + v1(current, now.Add(-stripewebhook.DefaultTolerance-time.Minute), b)
		}},
	}
	out := make([]webhooktest.StripeCase, 0, len(specs))
	for _, s := range specs {
		at := ts
		if !s.ts.IsZero() {
			at = s.ts
		}
		secrets := s.secrets
		if secrets == nil {
			secrets = []string{current}
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
		out = append(out, webhooktest.StripeCase{Name: s.name, Secrets: secrets, Signature: header, Body: string(sent), Accepted: accepted})
	}
	return out
}

// stripeVersion is the version of stripe-go the checks module requires.
func stripeVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", stripeModule).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// The Stripe fixture is what stripe-go gives: signed again at the file's
// time, every case has the file's signature and body; signed now, stripe-go
// judges every case as the file says. With -update, the file is written
// from stripe-go now.
func TestStripeFixturesAreStripeGos(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	if *update {
		f := webhooktest.StripeFile{
			GeneratedBy: "checks/webhook: go test ./webhook -run TestStripeFixturesAreStripeGos -update",
			Versions:    map[string]string{stripeModule: stripeVersion(t)},
			Now:         now.Unix(),
			Stripe:      stripeCases(now),
		}
		b, err := json.MarshalIndent(f, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(stripeFile, append(b, '\n'), 0o644))
	}

	var file webhooktest.StripeFile
	b, err := os.ReadFile(stripeFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &file))
	embedded, err := webhooktest.StripeCases()
	require.NoError(t, err)
	require.Len(t, embedded, len(file.Stripe), "webhooktest embeds the file")

	pinned := stripeCases(time.Unix(file.Now, 0))
	fresh := stripeCases(now)
	require.Len(t, file.Stripe, len(fresh), "the file has every case")
	accepted := 0
	for i, c := range file.Stripe {
		require.Equal(t, pinned[i].Name, c.Name)
		require.Equal(t, pinned[i], webhooktest.StripeCase{Name: c.Name, Secrets: c.Secrets, Signature: c.Signature, Body: c.Body, Accepted: pinned[i].Accepted},
			"%s: stripe-go signs it as the file says (regenerate: go test ./webhook -update)", c.Name)
		require.Equal(t, fresh[i].Accepted, c.Accepted, "%s: stripe-go's verdict (regenerate: go test ./webhook -update)", c.Name)
		if c.Accepted {
			accepted++
		}
	}
	require.Positive(t, accepted)
	require.Less(t, accepted, len(file.Stripe))
}

// jetflow's own Stripe signer (webhook.Sign, which the HTTP API's tests
// sign Stripe deliveries with) writes the header stripe-go's
// GenerateTestSignedPayload writes.
func TestSignIsStripeGos(t *testing.T) {
	t.Parallel()
	ts := time.Unix(1_700_000_000, 0)
	for _, body := range []string{`{"id":"evt_1","type":"payment_intent.succeeded"}`, `{}`, ``} {
		want := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: []byte(body), Secret: webhooktest.StripeSecret, Timestamp: ts})
		got := jetflowwebhook.Sign(jetflowwebhook.Stripe, webhooktest.StripeSecret, "ignored", ts, []byte(body))
		require.Equal(t, http.Header{"Stripe-Signature": {want.Header}}, got, "body %q", body)
	}
}
