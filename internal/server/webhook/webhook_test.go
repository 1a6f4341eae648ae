package webhook

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// now is the verifier's clock in every test.
var now = time.Unix(1_700_000_000, 0)

// Secrets per provider: the current one and a rotated (older) one. Every
// string here is searched for in error messages and formatted sources.
var (
	standardSecrets = [2]string{
		"whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-key-current-0001")),
		base64.StdEncoding.EncodeToString([]byte("standard-key-rotated-0002")), // no prefix
	}
	githubSecrets = [2]string{"gh-secret-current-0001", "gh-secret-rotated-0002"}
	stripeSecrets = [2]string{"whsec_stripe_current_0001", "whsec_stripe_rotated_0002"}
	otherSecret   = map[Provider]string{
		Standard: "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-key-wrong-0003")),
		GitHub:   "gh-secret-wrong-0003",
		Stripe:   "whsec_stripe_wrong_0003",
	}
)

// fixture is one provider's valid delivery and the headers it needs.
type fixture struct {
	p        Provider
	secrets  [2]string
	id       string
	body     []byte
	sigName  string   // the header holding the signature
	required []string // headers whose absence is ErrMissingHeader
	want     Event
}

func fixtures() []fixture {
	ts := now.Add(-30 * time.Second)
	return []fixture{
		{
			p: Standard, secrets: standardSecrets, id: "msg_2Lx0a9",
			body:     []byte(`{"type":"invoice.paid","data":{"n":1}}`),
			sigName:  headerStandardSignature,
			required: []string{headerStandardID, headerStandardTimestamp, headerStandardSignature},
			want:     Event{ID: "msg_2Lx0a9", Type: "invoice.paid", Timestamp: ts.UTC()},
		},
		{
			p: GitHub, secrets: githubSecrets, id: "72d3162e-cc78-11e3-81ab-4c9367dc0958",
			body:     []byte(`{"action":"opened","number":7}`),
			sigName:  headerGitHubSignature,
			required: []string{headerGitHubDelivery, headerGitHubSignature},
			want:     Event{ID: "72d3162e-cc78-11e3-81ab-4c9367dc0958", Type: "pull_request"},
		},
		{
			p: Stripe, secrets: stripeSecrets, id: "ignored",
			body:     []byte(`{"id":"evt_1NG8Du2eZvKYlo2C","type":"payment_intent.succeeded","object":"event"}`),
			sigName:  headerStripeSignature,
			required: []string{headerStripeSignature},
			want:     Event{ID: "evt_1NG8Du2eZvKYlo2C", Type: "payment_intent.succeeded", Timestamp: ts.UTC()},
		},
	}
}

func (f fixture) source(secrets ...string) Source {
	return Source{Name: string(f.p), Provider: f.p, Workflow: "handle", Secrets: secrets}
}

// sign returns the fixture's delivery headers signed with secret at ts.
func (f fixture) sign(secret string, ts time.Time, body []byte) http.Header {
	h := Sign(f.p, secret, f.id, ts, body)
	if f.p == GitHub {
		h.Set(headerGitHubEvent, "pull_request")
	}
	return h
}

// flip changes the first character of a signature value (after its prefix)
// to another character of the same alphabet, so the header still parses.
func flip(p Provider, header string) string {
	i := map[Provider]int{Standard: len("v1,"), GitHub: len("sha256=")}[p]
	if p == Stripe {
		i = strings.Index(header, "v1=") + len("v1=")
	}
	c := byte('a')
	if header[i] == 'a' {
		c = 'b'
	}
	return header[:i] + string(c) + header[i+1:]
}

// secretsAndSignatures lists every string that must never appear in an
// error message or formatted source.
func secretsAndSignatures(h http.Header) []string {
	var out []string
	for _, set := range [][2]string{standardSecrets, githubSecrets, stripeSecrets} {
		out = append(out, set[0], set[1])
		for _, s := range set {
			if key, err := standardKey(s); err == nil {
				out = append(out, string(key))
			}
		}
	}
	for _, s := range otherSecret {
		out = append(out, s)
	}
	for _, name := range []string{headerStandardSignature, headerGitHubSignature, headerStripeSignature} {
		for _, v := range h.Values(name) {
			for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == '=' || r == ' ' }) {
				if len(f) >= 16 { // signature values, not v1 or t
					out = append(out, f)
				}
			}
		}
	}
	return out
}

func requireNoLeak(t *testing.T, s string, h http.Header) {
	t.Helper()
	for _, secret := range secretsAndSignatures(h) {
		require.NotContains(t, s, secret)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	ts := now.Add(-30 * time.Second)
	for _, f := range fixtures() {
		valid := f.sign(f.secrets[0], ts, f.body)
		type tc struct {
			name    string
			src     Source
			h       http.Header
			body    []byte
			wantErr error
			signed  time.Time // when the delivery was signed, if not ts
		}
		cases := []tc{
			{name: "valid", src: f.source(f.secrets[0]), h: valid, body: f.body},
			{name: "tampered body", src: f.source(f.secrets[0]), h: valid,
				body: append([]byte(`{"x":1,`), f.body[1:]...), wantErr: ErrBadSignature},
			{name: "tampered signature", src: f.source(f.secrets[0]),
				h: with(valid, f.sigName, flip(f.p, valid.Get(f.sigName))), body: f.body, wantErr: ErrBadSignature},
			{name: "wrong secret", src: f.source(otherSecret[f.p]), h: valid, body: f.body, wantErr: ErrBadSignature},
			{name: "rotated secret first", src: f.source(f.secrets[1], f.secrets[0]), h: valid, body: f.body},
			{name: "rotated secret second", src: f.source(f.secrets[0], f.secrets[1]),
				h: f.sign(f.secrets[1], ts, f.body), body: f.body},
			{name: "repeated signature header", src: f.source(f.secrets[0]),
				h: add(valid, f.sigName, valid.Get(f.sigName)), body: f.body, wantErr: ErrMalformed},
			{name: "invalid source", src: Source{Name: "x", Provider: f.p, Workflow: "w"},
				h: valid, body: f.body, wantErr: ErrInvalidSource},
		}
		for _, name := range f.required {
			cases = append(cases,
				tc{name: "missing " + name, src: f.source(f.secrets[0]), h: without(valid, name), body: f.body, wantErr: ErrMissingHeader},
				tc{name: "empty " + name, src: f.source(f.secrets[0]), h: with(valid, name, ""), body: f.body, wantErr: ErrMissingHeader})
		}
		for _, m := range malformed[f.p] {
			cases = append(cases, tc{name: m.name, src: f.source(f.secrets[0]),
				h: with(valid, m.header, m.value(valid, f.body)), body: f.body, wantErr: m.wantErr})
		}
		if f.p != GitHub {
			tol := f.source(f.secrets[0])
			tol.Tolerance = time.Minute
			cases = append(cases,
				tc{name: "stale", src: f.source(f.secrets[0]), h: f.sign(f.secrets[0], now.Add(-DefaultTolerance-time.Second), f.body),
					body: f.body, wantErr: ErrStaleTimestamp},
				tc{name: "future", src: f.source(f.secrets[0]), h: f.sign(f.secrets[0], now.Add(DefaultTolerance+time.Second), f.body),
					body: f.body, wantErr: ErrStaleTimestamp},
				tc{name: "oldest accepted", src: f.source(f.secrets[0]), h: f.sign(f.secrets[0], now.Add(-DefaultTolerance), f.body),
					body: f.body, signed: now.Add(-DefaultTolerance)},
				tc{name: "newest accepted", src: f.source(f.secrets[0]), h: f.sign(f.secrets[0], now.Add(DefaultTolerance), f.body),
					body: f.body, signed: now.Add(DefaultTolerance)},
				tc{name: "custom tolerance accepts", src: tol, h: valid, body: f.body},
				tc{name: "custom tolerance refuses", src: tol, h: f.sign(f.secrets[0], now.Add(-2*time.Minute), f.body),
					body: f.body, wantErr: ErrStaleTimestamp},
			)
		}
		for _, c := range cases {
			t.Run(string(f.p)+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				ev, err := c.src.Verify(c.h, c.body, now)
				if c.wantErr != nil {
					require.ErrorIs(t, err, c.wantErr)
					require.Zero(t, ev)
					requireNoLeak(t, err.Error(), c.h)
					require.NotContains(t, err.Error(), string(c.body))
					return
				}
				require.NoError(t, err)
				want := f.want
				if !c.signed.IsZero() {
					want.Timestamp = c.signed.UTC()
				}
				require.Equal(t, want, ev)
			})
		}
	}
}

type malformedCase struct {
	name    string
	header  string
	value   func(valid http.Header, body []byte) string
	wantErr error
}

func fixed(v string) func(http.Header, []byte) string {
	return func(http.Header, []byte) string { return v }
}

// malformed lists, per provider, header values that must be refused.
var malformed = map[Provider][]malformedCase{
	Standard: {
		{"timestamp not a number", headerStandardTimestamp, fixed("17e8"), ErrMalformed},
		{"timestamp signed", headerStandardTimestamp, fixed("+1700000000"), ErrMalformed},
		{"timestamp negative", headerStandardTimestamp, fixed("-1"), ErrMalformed},
		{"timestamp too long", headerStandardTimestamp, fixed("99999999999999999999"), ErrMalformed},
		{"timestamp changed", headerStandardTimestamp, fixed("1700000001"), ErrBadSignature},
		{"id changed", headerStandardID, fixed("msg_other"), ErrBadSignature},
		{"signature without version", headerStandardSignature, func(h http.Header, _ []byte) string {
			return strings.TrimPrefix(h.Get(headerStandardSignature), "v1,")
		}, ErrBadSignature},
		{"signature not base64", headerStandardSignature, fixed("v1,@@@@"), ErrBadSignature},
		{"unparseable entries beside a valid one", headerStandardSignature, func(h http.Header, _ []byte) string {
			return "garbage v1,@@@@ v1 v1,AAA= " + h.Get(headerStandardSignature) + " v1,"
		}, nil},
		{"valid entry with a trailing field", headerStandardSignature, func(h http.Header, _ []byte) string {
			return h.Get(headerStandardSignature) + ",extra"
		}, nil},
		{"signature only other versions", headerStandardSignature, func(h http.Header, _ []byte) string {
			return "v1a,AAAA v2," + strings.TrimPrefix(h.Get(headerStandardSignature), "v1,")
		}, ErrBadSignature},
		{"signature among others", headerStandardSignature, func(h http.Header, _ []byte) string {
			return "v1a,AAAA v1,AAAA " + h.Get(headerStandardSignature) + " v2,BBBB"
		}, nil},
	},
	GitHub: {
		{"signature sha1", headerGitHubSignature, func(h http.Header, _ []byte) string {
			return "sha1=" + strings.TrimPrefix(h.Get(headerGitHubSignature), "sha256=")
		}, ErrMalformed},
		{"signature without prefix", headerGitHubSignature, func(h http.Header, _ []byte) string {
			return strings.TrimPrefix(h.Get(headerGitHubSignature), "sha256=")
		}, ErrMalformed},
		{"signature not hex", headerGitHubSignature, fixed("sha256=zz"), ErrMalformed},
		{"signature short", headerGitHubSignature, func(h http.Header, _ []byte) string {
			return h.Get(headerGitHubSignature)[:len("sha256=")+62]
		}, ErrBadSignature},
		{"signature upper-case hex", headerGitHubSignature, func(h http.Header, _ []byte) string {
			return "sha256=" + strings.ToUpper(strings.TrimPrefix(h.Get(headerGitHubSignature), "sha256="))
		}, nil},
	},
	Stripe: {
		{"no t", headerStripeSignature, func(h http.Header, _ []byte) string {
			_, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return v1
		}, ErrMalformed},
		{"two t", headerStripeSignature, func(h http.Header, _ []byte) string {
			return "t=1700000000," + h.Get(headerStripeSignature)
		}, ErrMalformed},
		{"t not a number", headerStripeSignature, func(h http.Header, _ []byte) string {
			_, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return "t=soon," + v1
		}, ErrMalformed},
		{"element without =", headerStripeSignature, func(h http.Header, _ []byte) string {
			return h.Get(headerStripeSignature) + ",v1"
		}, ErrMalformed},
		{"v1 not hex", headerStripeSignature, fixed("t=1699999970,v1=xyz"), ErrBadSignature},
		{"v1 not hex beside a valid v1", headerStripeSignature, func(h http.Header, _ []byte) string {
			t, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return t + ",v1=xyz,v1=," + v1 + ",v1=abc"
		}, nil},
		{"no v1", headerStripeSignature, func(h http.Header, _ []byte) string {
			t, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return t + ",v0=" + strings.TrimPrefix(v1, "v1=")
		}, ErrBadSignature},
		{"t changed", headerStripeSignature, func(h http.Header, _ []byte) string {
			_, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return "t=1699999971," + v1
		}, ErrBadSignature},
		{"second v1 matches", headerStripeSignature, func(h http.Header, _ []byte) string {
			t, v1, _ := strings.Cut(h.Get(headerStripeSignature), ",")
			return t + ",v1=" + strings.Repeat("ab", 32) + ", " + v1 + ",v0=00"
		}, nil},
		{"v1 of another secret only", headerStripeSignature, func(_ http.Header, body []byte) string {
			return Sign(Stripe, otherSecret[Stripe], "", now.Add(-30*time.Second), body).Get(headerStripeSignature)
		}, ErrBadSignature},
	},
}

func with(h http.Header, name, value string) http.Header {
	c := h.Clone()
	c.Set(name, value)
	return c
}

func add(h http.Header, name, value string) http.Header {
	c := h.Clone()
	c.Add(name, value)
	return c
}

func without(h http.Header, name string) http.Header {
	c := h.Clone()
	c.Del(name)
	return c
}

// TestVerifyStripeBody: a correctly signed Stripe delivery whose body has no
// usable event ID is ErrMalformed.
func TestVerifyStripeBody(t *testing.T) {
	t.Parallel()
	src := Source{Name: "stripe", Provider: Stripe, Workflow: "handle", Secrets: stripeSecrets[:1]}
	for name, body := range map[string]string{
		"not JSON":      `evt_1`,
		"array":         `["evt_1"]`,
		"null":          `null`,
		"no id":         `{"type":"charge.succeeded"}`,
		"empty id":      `{"id":"","type":"charge.succeeded"}`,
		"numeric id":    `{"id":12,"type":"charge.succeeded"}`,
		"trailing data": `{"id":"evt_1"} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := Sign(Stripe, stripeSecrets[0], "", now, []byte(body))
			ev, err := src.Verify(h, []byte(body), now)
			require.ErrorIs(t, err, ErrMalformed)
			require.Zero(t, ev)
			require.NotContains(t, err.Error(), body)
		})
	}
}

// TestVerifyStandardBody: Standard Webhooks does not require JSON; the type
// comes from a JSON object's "type" when there is one.
func TestVerifyStandardBody(t *testing.T) {
	t.Parallel()
	src := Source{Name: "std", Provider: Standard, Workflow: "handle", Secrets: standardSecrets[:1]}
	for body, wantType := range map[string]string{
		`plain text`:               "",
		`{"type":7}`:               "",
		`{"data":{}}`:              "",
		`{"type":"user.created"}`:  "user.created",
		`{"type":"a","extra":[1]}`: "a",
	} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			h := Sign(Standard, standardSecrets[0], "msg_1", now, []byte(body))
			ev, err := src.Verify(h, []byte(body), now)
			require.NoError(t, err)
			require.Equal(t, Event{ID: "msg_1", Type: wantType, Timestamp: now.UTC()}, ev)
		})
	}
}

// TestSignUnusableSecret: Sign cannot sign Standard with a secret that is
// not base64, and Verify refuses what it returns.
func TestSignUnusableSecret(t *testing.T) {
	t.Parallel()
	h := Sign(Standard, "whsec_not base64!", "msg_1", now, []byte("x"))
	require.Empty(t, h.Get(headerStandardSignature))
	_, err := Source{Name: "s", Provider: Standard, Workflow: "w", Secrets: standardSecrets[:1]}.Verify(h, []byte("x"), now)
	require.ErrorIs(t, err, ErrMissingHeader)
	require.Empty(t, Sign("other", "secret", "id", now, []byte("x")))
}

func TestValidate(t *testing.T) {
	t.Parallel()
	good := Source{Name: "gh_main-1", Provider: GitHub, Workflow: "on-push", Secrets: githubSecrets[:]}
	require.NoError(t, good.Validate())
	require.NoError(t, Source{Name: "s", Provider: Standard, Workflow: "w", Secrets: standardSecrets[:], Tolerance: time.Second}.Validate())

	for _, c := range []struct {
		name  string
		edit  func(*Source)
		field string
	}{
		{"empty name", func(s *Source) { s.Name = "" }, "Name"},
		{"name with dot", func(s *Source) { s.Name = "a.b" }, "Name"},
		{"name too long", func(s *Source) { s.Name = strings.Repeat("n", 65) }, "Name"},
		{"unknown provider", func(s *Source) { s.Provider = "gitlab" }, "Provider"},
		{"empty provider", func(s *Source) { s.Provider = "" }, "Provider"},
		{"empty workflow", func(s *Source) { s.Workflow = "" }, "Workflow"},
		{"workflow with slash", func(s *Source) { s.Workflow = "a/b" }, "Workflow"},
		{"no secrets", func(s *Source) { s.Secrets = nil }, "Secrets"},
		{"empty secret", func(s *Source) { s.Secrets = []string{githubSecrets[0], ""} }, "Secrets[1]"},
		{"standard secret not base64", func(s *Source) {
			s.Provider = Standard
			s.Secrets = []string{standardSecrets[0], githubSecrets[0] + "!"}
		}, "Secrets[1]"},
		{"standard secret empty key", func(s *Source) { s.Provider = Standard; s.Secrets = []string{"whsec_"} }, "Secrets[0]"},
		{"negative tolerance", func(s *Source) { s.Tolerance = -time.Second }, "Tolerance"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := good
			s.Secrets = append([]string(nil), good.Secrets...)
			c.edit(&s)
			err := s.Validate()
			require.ErrorIs(t, err, ErrInvalidSource)
			require.Contains(t, err.Error(), c.field)
			requireNoLeak(t, err.Error(), nil)
		})
	}
}

// TestRunID: an event ID that fits a run ID is kept; any other non-empty
// one is hashed, never refused; no two event IDs share a run ID.
func TestRunID(t *testing.T) {
	t.Parallel()
	src := Source{Name: "stripe", Provider: Stripe, Workflow: "w", Secrets: stripeSecrets[:1]}
	maxID := strings.Repeat("e", state.MaxRunIDLen-len("stripe-"))
	// Computed outside Go: printf %s msg.1 | openssl dgst -sha256 -binary | base64 | tr '+/' '-_' | tr -d =
	// A change here moves every hashed event's run ID, so redeliveries
	// after an upgrade would start second runs.
	const hashedMsg1 = "stripe-=8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4"
	kept := []string{"evt_1NG8Du2eZvKYlo2C", "72d3162e-cc78-11e3-81ab-4c9367dc0958", "a=b", maxID,
		"8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4"} // the hash of msg.1 as an event ID of its own
	hashed := []string{"msg.1", "evt.1", "evt:1", "evt/1", "evt 1", "evt*", "évt", "\x00", maxID + "e",
		strings.Repeat("x", 4096), "=", "=8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4", "msg.1 "}
	seen := map[string]string{} // run ID -> event ID
	record := func(id, runID string) {
		t.Helper()
		require.NoError(t, state.ValidateRunID(runID), id)
		prev, dup := seen[runID]
		require.False(t, dup, "event IDs %q and %q share run ID %s", prev, id, runID)
		seen[runID] = id
		again, err := src.RunID(Event{ID: id, Type: "other", Timestamp: now})
		require.NoError(t, err)
		require.Equal(t, runID, again, "same event, same run ID")
	}
	for _, id := range kept {
		got, err := src.RunID(Event{ID: id})
		require.NoError(t, err, id)
		require.Equal(t, "stripe-"+id, got)
		record(id, got)
	}
	for _, id := range hashed {
		got, err := src.RunID(Event{ID: id})
		require.NoError(t, err, id)
		require.True(t, strings.HasPrefix(got, "stripe-="), got)
		require.Len(t, got, len("stripe-=")+43)
		record(id, got)
	}
	got, err := src.RunID(Event{ID: "msg.1"})
	require.NoError(t, err)
	require.Equal(t, hashedMsg1, got)

	// The longest source name still leaves room for a hash.
	long := Source{Name: strings.Repeat("n", state.MaxNameLen)}
	got, err = long.RunID(Event{ID: "evt.1"})
	require.NoError(t, err)
	require.NoError(t, state.ValidateRunID(got))

	got, err = src.RunID(Event{})
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorIs(t, err, state.ErrInvalidRunID)
	require.Empty(t, got)
	_, err = Source{Name: "a.b"}.RunID(Event{ID: "evt_1"})
	require.ErrorIs(t, err, ErrInvalidSource)
}

// TestRunSource: the run's source keeps the original event ID, within the
// source length limit, and StartedRun recognises it and the older form.
func TestRunSource(t *testing.T) {
	t.Parallel()
	src := Source{Name: "stripe", Provider: Stripe, Workflow: "w", Secrets: stripeSecrets[:1]}
	require.Equal(t, "webhook:stripe:evt_1", src.RunSource(Event{ID: "evt_1"}))
	require.Equal(t, "webhook:stripe:msg.1:a/b c", src.RunSource(Event{ID: "msg.1:a/b c"}))
	require.Equal(t, `webhook:stripe:"\u00e9vt\x00"`, src.RunSource(Event{ID: "évt\x00"}))
	clipped := src.RunSource(Event{ID: strings.Repeat("x", 1000)})
	require.Len(t, clipped, state.MaxSourceLen)
	require.True(t, strings.HasPrefix(clipped, "webhook:stripe:xxx"))
	require.True(t, strings.HasSuffix(clipped, "x..."))
	fits := strings.Repeat("y", state.MaxSourceLen-len("webhook:stripe:"))
	require.Equal(t, "webhook:stripe:"+fits, src.RunSource(Event{ID: fits}))
	require.NoError(t, state.ValidateSource(clipped))

	for runSource, want := range map[string]bool{
		src.RunSource(Event{ID: "evt_1"}): true,
		clipped:                           true,
		"webhook:stripe":                  true, // runs started before event IDs were recorded
		"webhook:stripe-eu:evt_1":         false,
		"webhook:stripe-eu":               false,
		"webhook:stripex":                 false,
		"http":                            false,
		"":                                false,
	} {
		require.Equal(t, want, src.StartedRun(runSource), runSource)
	}
}

// TestSourceNeverPrintsSecrets formats a Source every way a log line or a
// config dump might.
func TestSourceNeverPrintsSecrets(t *testing.T) {
	t.Parallel()
	for _, src := range []Source{
		{Name: "std", Provider: Standard, Workflow: "w", Secrets: standardSecrets[:], Tolerance: time.Minute},
		{Name: "gh", Provider: GitHub, Workflow: "w", Secrets: githubSecrets[:]},
		{Name: "st", Provider: Stripe, Workflow: "w", Secrets: stripeSecrets[:]},
	} {
		t.Run(src.Name, func(t *testing.T) {
			t.Parallel()
			type config struct {
				Sources []Source
				One     *Source
			}
			var outs []string
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T %v"} {
				outs = append(outs, fmt.Sprintf(verb, src), fmt.Sprintf(verb, &src),
					fmt.Sprintf(verb, config{Sources: []Source{src}, One: &src}))
			}
			outs = append(outs, src.String(), src.GoString(), fmt.Sprint(src), fmt.Sprintln(&src))
			for _, v := range []any{src, &src, []Source{src}, config{Sources: []Source{src}, One: &src}} {
				b, err := json.Marshal(v)
				require.NoError(t, err)
				outs = append(outs, string(b))
			}
			for _, out := range outs {
				requireNoLeak(t, out, nil)
				require.NotContains(t, out, src.Secrets[0][:12], out)
			}
			require.Contains(t, src.String(), "2 redacted")
			require.Contains(t, src.GoString(), "2 redacted")

			b, err := json.Marshal(src)
			require.NoError(t, err)
			var fields map[string]any
			require.NoError(t, json.Unmarshal(b, &fields))
			require.Equal(t, map[string]any{
				"name": src.Name, "provider": string(src.Provider), "workflow": "w",
				"secrets": "[2 redacted]", "tolerance": src.Tolerance.String(),
			}, fields)
			var back Source
			require.Error(t, json.Unmarshal(b, &back), "a redacted dump must not load as a source")
		})
	}
}

func TestErrorsAreDistinct(t *testing.T) {
	t.Parallel()
	all := []error{ErrMissingHeader, ErrMalformed, ErrBadSignature, ErrStaleTimestamp, ErrInvalidSource}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, i == j, errors.Is(a, b), "%v vs %v", a, b)
		}
	}
}
