// Package token checks the API tokens of producer serve, for the JSON API
// (internal/server/httpapi) and the web inspector (internal/server/inspector) alike: a
// bearer token in the Authorization header, or the inspector's cookie,
// which is taken only on a request that also carries the header
// X-Jetflow-UI: 1. A cross-site form or link cannot set that header, so the
// cookie alone never authorizes a request another site makes the browser
// send (CSRF).
package token

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
)

// CookieName is the inspector's cookie; it holds a token (CookieValue).
const CookieName = "jetflow_token"

// CookieValue is the cookie's value for tok: base64url, since a token may
// hold bytes a cookie value may not (quotes, semicolons, spaces).
func CookieValue(tok string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strings.TrimSpace(tok)))
}

// HeaderUI is the header the inspector's requests carry, with the value "1",
// for the cookie to count.
const HeaderUI = "X-Jetflow-UI"

// Result is what a request's credentials come to.
type Result int

const (
	// Open: no tokens are configured, every request is let in.
	Open Result = iota
	// Valid: the request carries one of the tokens.
	Valid
	// Missing: the request carries no token (or a cookie without the
	// X-Jetflow-UI header).
	Missing
	// Invalid: the request carries a token that is not one of them.
	Invalid
)

// OK reports whether r lets the request in.
func (r Result) OK() bool { return r == Open || r == Valid }

// Set is the tokens a server accepts, kept as SHA-256 hashes and compared
// in constant time. The zero Set (and a nil *Set) accepts every request.
type Set struct {
	hashes [][sha256.Size]byte
}

// NewSet returns the set of tokens. Surrounding white space is ignored; a
// token that is empty is an error.
func NewSet(tokens []string) (*Set, error) {
	s := &Set{}
	for i, t := range tokens {
		t = strings.TrimSpace(t)
		if t == "" {
			return nil, fmt.Errorf("token %d is empty", i)
		}
		s.hashes = append(s.hashes, sha256.Sum256([]byte(t)))
	}
	return s, nil
}

// Open reports whether the set has no tokens: nothing is protected.
func (s *Set) Open() bool { return s == nil || len(s.hashes) == 0 }

// Match reports whether tok is one of the tokens (never, for an empty
// set). It takes the same time whichever token matches.
func (s *Set) Match(tok string) bool {
	if s.Open() {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	ok := 0
	for _, want := range s.hashes {
		ok |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return ok == 1
}

// Bearer checks the request's Authorization: Bearer header only.
func (s *Set) Bearer(r *http.Request) Result {
	if s.Open() {
		return Open
	}
	scheme, tok, found := strings.Cut(r.Header.Get("Authorization"), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return Missing
	}
	return s.result(tok)
}

// Cookie checks the inspector's cookie only, whether or not the request
// carries X-Jetflow-UI: for a page a browser navigates to, which cannot
// set headers and changes nothing.
func (s *Set) Cookie(r *http.Request) Result {
	if s.Open() {
		return Open
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return Missing
	}
	tok, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return Invalid
	}
	return s.result(string(tok))
}

// Request checks an API request: its bearer token, or else its cookie if
// it carries X-Jetflow-UI: 1.
func (s *Set) Request(r *http.Request) Result {
	if res := s.Bearer(r); res != Missing {
		return res
	}
	if r.Header.Get(HeaderUI) != "1" {
		return Missing
	}
	return s.Cookie(r)
}

func (s *Set) result(tok string) Result {
	if s.Match(tok) {
		return Valid
	}
	return Invalid
}
