package webhook

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

var fuzzProviders = []Provider{Standard, GitHub, Stripe}

// fuzzDelivery builds a delivery for provider index pi: id (ignored for
// Stripe), the timestamp now+offset (ignored for GitHub) and sig, the
// signature header's value (for Stripe, what follows "t=<ts>,").
func fuzzDelivery(pi uint8, id string, offset int64, sig string) (Provider, int64, http.Header) {
	p := fuzzProviders[int(pi)%len(fuzzProviders)]
	ts := now.Unix() + offset
	rawTS := strconv.FormatInt(ts, 10)
	h := http.Header{}
	switch p {
	case Standard:
		h.Set(headerStandardID, id)
		h.Set(headerStandardTimestamp, rawTS)
		h.Set(headerStandardSignature, sig)
	case GitHub:
		h.Set(headerGitHubDelivery, id)
		h.Set(headerGitHubSignature, sig)
	case Stripe:
		h.Set(headerStripeSignature, "t="+rawTS+","+sig)
	}
	return p, ts, h
}

func fuzzSecret(p Provider) string {
	return map[Provider][2]string{Standard: standardSecrets, GitHub: githubSecrets, Stripe: stripeSecrets}[p][0]
}

// carries reports whether the fuzzed signature header value sig contains
// the signature Sign made (want: Sign's headers), in a form the scheme
// treats as the same (hex is case-insensitive; Stripe elements may have
// spaces around them; a Standard entry may have fields after its signature).
func carries(p Provider, sig string, want http.Header) bool {
	switch p {
	case Standard:
		for _, entry := range strings.Fields(sig) {
			version, rest, _ := strings.Cut(entry, ",")
			first, _, _ := strings.Cut(rest, ",") // a v1 entry's fields after the signature are ignored
			if version+","+first == want.Get(headerStandardSignature) {
				return true
			}
		}
	case GitHub:
		return strings.EqualFold(sig, want.Get(headerGitHubSignature))
	case Stripe:
		_, v1, _ := strings.Cut(want.Get(headerStripeSignature), ",")
		for _, part := range strings.Split(sig, ",") {
			if strings.EqualFold(strings.TrimSpace(part), v1) {
				return true
			}
		}
	}
	return false
}

// FuzzVerify: Verify never panics, accepts a delivery only if it carries
// the signature Sign makes with the source's secret for that id, timestamp
// and body, fails only with the package's errors (none quoting the secret),
// and accepts what Sign makes.
func FuzzVerify(f *testing.F) {
	body := []byte(`{"id":"evt_1","type":"a.b"}`)
	for pi, p := range fuzzProviders {
		want := Sign(p, fuzzSecret(p), "msg_1", now.Add(-30*time.Second), body)
		sig := want.Get(headerStandardSignature) + want.Get(headerGitHubSignature)
		if p == Stripe {
			_, sig, _ = strings.Cut(want.Get(headerStripeSignature), ",")
		}
		f.Add(uint8(pi), "msg_1", int64(-30), body, sig)
		f.Add(uint8(pi), "msg_1", int64(-30), body[1:], sig)
		f.Add(uint8(pi), "", int64(400), []byte{}, "v1,=")
	}

	f.Fuzz(func(t *testing.T, pi uint8, id string, offset int64, body []byte, sig string) {
		p, ts, h := fuzzDelivery(pi, id, offset, sig)
		secret := fuzzSecret(p)
		src := Source{Name: "fz", Provider: p, Workflow: "w", Secrets: []string{secret}}

		ev, err := src.Verify(h, body, now)
		if err == nil {
			require.True(t, carries(p, sig, Sign(p, secret, id, time.Unix(ts, 0), body)),
				"accepted a delivery that does not carry Sign's signature")
			if p != Stripe {
				require.Equal(t, id, ev.ID)
			}
			require.NotEmpty(t, ev.ID)
		} else {
			require.Zero(t, ev)
			require.True(t, errors.Is(err, ErrMissingHeader) || errors.Is(err, ErrMalformed) ||
				errors.Is(err, ErrBadSignature) || errors.Is(err, ErrStaleTimestamp), "unexpected error %v", err)
			require.NotContains(t, err.Error(), secret)
		}

		// What Sign makes, Verify accepts (Stripe: if the body has an id).
		ev, err = src.Verify(Sign(p, secret, id, now, body), body, now)
		switch {
		case p == Stripe:
			if err != nil {
				require.ErrorIs(t, err, ErrMalformed)
			} else {
				require.NotEmpty(t, ev.ID)
			}
		case id == "":
			require.ErrorIs(t, err, ErrMissingHeader)
		default:
			require.NoError(t, err)
			require.Equal(t, id, ev.ID)
		}
	})
}

// FuzzRunID: every non-empty event ID has a valid run ID, the same each
// time, and two distinct event IDs never share one.
func FuzzRunID(f *testing.F) {
	f.Add("evt_1", "evt.1")
	f.Add("8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4", "msg.1")
	f.Add("=8ELI0fUC7buFi3Mo5GBUeQ4pEaTCzvxLtBA0k-QV3y4", "msg.1")
	f.Add(strings.Repeat("e", 121), strings.Repeat("e", 122))
	src := Source{Name: "fz", Provider: Standard, Workflow: "w"}
	f.Fuzz(func(t *testing.T, a, b string) {
		if a == "" || b == "" {
			return
		}
		ra, err := src.RunID(Event{ID: a})
		require.NoError(t, err)
		require.NoError(t, state.ValidateRunID(ra))
		again, err := src.RunID(Event{ID: a})
		require.NoError(t, err)
		require.Equal(t, ra, again)
		rb, err := src.RunID(Event{ID: b})
		require.NoError(t, err)
		require.Equal(t, a == b, ra == rb, "event IDs %q and %q, run IDs %s and %s", a, b, ra, rb)
	})
}
