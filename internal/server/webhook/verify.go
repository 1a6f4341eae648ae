package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names, canonical as net/http stores them.
const (
	headerStandardID        = "Webhook-Id"
	headerStandardTimestamp = "Webhook-Timestamp"
	headerStandardSignature = "Webhook-Signature"
	headerGitHubDelivery    = "X-Github-Delivery"
	headerGitHubSignature   = "X-Hub-Signature-256"
	headerGitHubEvent       = "X-Github-Event"
	headerStripeSignature   = "Stripe-Signature"
)

// Event is a verified delivery.
type Event struct {
	// ID is the provider's event or delivery ID.
	ID string
	// Type is the event type if the provider gives one (GitHub
	// X-GitHub-Event, which is not signed; the body's "type" for Stripe and
	// Standard), else "".
	Type string
	// Timestamp is the signed delivery time (UTC); zero for GitHub.
	Timestamp time.Time
}

// Verify checks a delivery's signature against each of the source's
// secrets (constant-time) and, for Standard and Stripe, that its timestamp
// is within Tolerance of now in either direction, then returns the event.
// On any failure it returns a zero Event and an error matching
// ErrMissingHeader, ErrMalformed, ErrBadSignature, ErrStaleTimestamp, or
// ErrInvalidSource when s itself fails Validate. Verify has no memory: the
// same delivery verifies again (within the tolerance); replay is stopped by
// run admission on RunID (see the package documentation). The body is read,
// never kept or quoted.
func (s Source) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	if err := s.Validate(); err != nil {
		return Event{}, err
	}
	keys, err := s.keys()
	if err != nil {
		return Event{}, err
	}
	var ev Event
	switch s.Provider {
	case Standard:
		ev, err = verifyStandard(keys, h, body, now, s.tolerance())
	case GitHub:
		ev, err = verifyGitHub(keys, h, body)
	case Stripe:
		ev, err = verifyStripe(keys, h, body, now, s.tolerance())
	}
	if err != nil {
		return Event{}, err
	}
	return ev, nil
}

func verifyStandard(keys [][]byte, h http.Header, body []byte, now time.Time, tol time.Duration) (Event, error) {
	id, err := single(h, headerStandardID)
	if err != nil {
		return Event{}, err
	}
	rawTS, err := single(h, headerStandardTimestamp)
	if err != nil {
		return Event{}, err
	}
	sigs, err := single(h, headerStandardSignature)
	if err != nil {
		return Event{}, err
	}
	ts, err := parseUnix(headerStandardTimestamp, rawTS)
	if err != nil {
		return Event{}, err
	}
	candidates, err := standardSignatures(sigs)
	if err != nil {
		return Event{}, err
	}
	if !matches(keys, candidates, []byte(id), dot, signedUnix(ts), dot, body) {
		return Event{}, fmt.Errorf("%w: no %s entry matches", ErrBadSignature, headerStandardSignature)
	}
	if err := checkTimestamp(ts, now, tol); err != nil {
		return Event{}, err
	}
	var payload struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(body, &payload) != nil {
		payload.Type = "" // Standard Webhooks does not require a JSON body.
	}
	return Event{ID: id, Type: payload.Type, Timestamp: time.Unix(ts, 0).UTC()}, nil
}

// standardSignatures decodes the v1 entries of a webhook-signature header,
// a space-separated list of "<version>,<signature>". As in the Standard
// Webhooks reference verifiers, an entry that is not a v1 entry with a
// base64 signature is skipped, not an error, so that a sender adding a
// scheme or a malformed entry beside a valid one is still verified; only a
// header without any usable v1 entry is refused (ErrBadSignature).
func standardSignatures(header string) ([][]byte, error) {
	var out [][]byte
	for _, entry := range strings.Fields(header) {
		version, rest, _ := strings.Cut(entry, ",")
		if version != "v1" {
			continue
		}
		sig, _, _ := strings.Cut(rest, ",") // "v1,<sig>,<more>": the reference verifiers read <sig>
		if b, err := base64.StdEncoding.Strict().DecodeString(sig); err == nil {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s has no v1 entry with a base64 signature", ErrBadSignature, headerStandardSignature)
	}
	return out, nil
}

func verifyGitHub(keys [][]byte, h http.Header, body []byte) (Event, error) {
	id, err := single(h, headerGitHubDelivery)
	if err != nil {
		return Event{}, err
	}
	header, err := single(h, headerGitHubSignature)
	if err != nil {
		return Event{}, err
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return Event{}, fmt.Errorf("%w: %s does not start with sha256=", ErrMalformed, headerGitHubSignature)
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %s is not hex after sha256=", ErrMalformed, headerGitHubSignature)
	}
	if !matches(keys, [][]byte{sig}, body) {
		return Event{}, fmt.Errorf("%w: %s does not match", ErrBadSignature, headerGitHubSignature)
	}
	return Event{ID: id, Type: h.Get(headerGitHubEvent)}, nil
}

func verifyStripe(keys [][]byte, h http.Header, body []byte, now time.Time, tol time.Duration) (Event, error) {
	header, err := single(h, headerStripeSignature)
	if err != nil {
		return Event{}, err
	}
	rawTS, candidates, err := parseStripe(header)
	if err != nil {
		return Event{}, err
	}
	ts, err := parseUnix(headerStripeSignature+" t", rawTS)
	if err != nil {
		return Event{}, err
	}
	if !matches(keys, candidates, signedUnix(ts), dot, body) {
		return Event{}, fmt.Errorf("%w: no %s v1 matches", ErrBadSignature, headerStripeSignature)
	}
	if err := checkTimestamp(ts, now, tol); err != nil {
		return Event{}, err
	}
	var payload struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	if json.Unmarshal(body, &payload) != nil {
		return Event{}, fmt.Errorf("%w: body is not a JSON object with a string id and type", ErrMalformed)
	}
	if payload.ID == "" {
		return Event{}, fmt.Errorf("%w: body has no event id", ErrMalformed)
	}
	return Event{ID: payload.ID, Type: payload.Type, Timestamp: time.Unix(ts, 0).UTC()}, nil
}

// parseStripe splits a Stripe-Signature header into its one t and its
// decoded v1 signatures. As in Stripe's own libraries, other schemes (v0)
// and v1 values that are not hex are skipped; an element without "=", a
// missing or repeated t is ErrMalformed, and a header without a hex v1 is
// ErrBadSignature.
func parseStripe(header string) (string, [][]byte, error) {
	var (
		rawTS string
		seenT bool
		sigs  [][]byte
	)
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return "", nil, fmt.Errorf("%w: %s element is not key=value", ErrMalformed, headerStripeSignature)
		}
		switch k {
		case "t":
			if seenT {
				return "", nil, fmt.Errorf("%w: %s has more than one t", ErrMalformed, headerStripeSignature)
			}
			rawTS, seenT = v, true
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			} // else skipped, as stripe-go does: another v1 may match.
		}
	}
	if !seenT {
		return "", nil, fmt.Errorf("%w: %s has no t", ErrMalformed, headerStripeSignature)
	}
	if len(sigs) == 0 {
		return "", nil, fmt.Errorf("%w: %s has no hex v1", ErrBadSignature, headerStripeSignature)
	}
	return rawTS, sigs, nil
}

var dot = []byte{'.'}

// matches reports whether any candidate equals HMAC-SHA256 of the
// concatenated parts under any key, comparing in constant time.
func matches(keys, candidates [][]byte, parts ...[]byte) bool {
	for _, key := range keys {
		mac := sign(key, parts...)
		for _, c := range candidates {
			if hmac.Equal(mac, c) {
				return true
			}
		}
	}
	return false
}

// sign is HMAC-SHA256 of the concatenated parts.
func sign(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p) // A hash.Hash never returns an error.
	}
	return m.Sum(nil)
}

// single returns the one value of header name: ErrMissingHeader when it is
// absent or empty, ErrMalformed when it is repeated.
func single(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0 || len(vs) == 1 && vs[0] == "":
		return "", fmt.Errorf("%w: %s", ErrMissingHeader, name)
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %s sent %d times", ErrMalformed, name, len(vs))
	}
	return vs[0], nil
}

// parseUnix parses integer unix seconds: 1..19 decimal digits, no sign.
func parseUnix(what, raw string) (int64, error) {
	bad := fmt.Errorf("%w: %s is not integer unix seconds", ErrMalformed, what)
	if raw == "" || strings.TrimLeft(raw, "0123456789") != "" {
		return 0, bad
	}
	ts, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, bad
	}
	return ts, nil
}

// signedUnix is the timestamp as the reference verifiers (standardwebhooks,
// stripe-go) put it in the signed content: the parsed integer in decimal,
// so a header "01700000000" is checked as "1700000000".
func signedUnix(ts int64) []byte {
	return strconv.AppendInt(nil, ts, 10)
}

// checkTimestamp refuses ts (unix seconds) further than tol from now, at
// one-second resolution.
func checkTimestamp(ts int64, now time.Time, tol time.Duration) error {
	switch {
	case ts < now.Add(-tol).Unix():
		return fmt.Errorf("%w: %d is more than %v in the past", ErrStaleTimestamp, ts, tol)
	case ts > now.Add(tol).Unix():
		return fmt.Errorf("%w: %d is more than %v in the future", ErrStaleTimestamp, ts, tol)
	}
	return nil
}
