package webhook

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"
)

// Sign returns the headers provider p would send with body, signed with
// secret, for event or delivery id at time ts (whole seconds): the same
// arguments always give the same headers, which Verify accepts for a source
// with that secret and a now within its tolerance of ts.
//
// For Stripe the event id is in the body, so id is ignored. For GitHub, Sign
// sets no X-GitHub-Event; add it if the event type matters. For Standard the
// secret must be valid base64 (Source.Validate); with one that is not, the
// headers have no webhook-signature, which Verify refuses as
// ErrMissingHeader. An unknown provider gets empty headers.
func Sign(p Provider, secret, id string, ts time.Time, body []byte) http.Header {
	h := http.Header{}
	rawTS := strconv.FormatInt(ts.Unix(), 10)
	switch p {
	case Standard:
		h.Set(headerStandardID, id)
		h.Set(headerStandardTimestamp, rawTS)
		if key, err := standardKey(secret); err == nil {
			mac := sign(key, []byte(id), dot, []byte(rawTS), dot, body)
			h.Set(headerStandardSignature, "v1,"+base64.StdEncoding.EncodeToString(mac))
		}
	case GitHub:
		h.Set(headerGitHubDelivery, id)
		h.Set(headerGitHubSignature, "sha256="+hex.EncodeToString(sign([]byte(secret), body)))
	case Stripe:
		mac := sign([]byte(secret), []byte(rawTS), dot, body)
		h.Set(headerStripeSignature, "t="+rawTS+",v1="+hex.EncodeToString(mac))
	}
	return h
}
