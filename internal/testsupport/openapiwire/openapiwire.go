// Package openapiwire is the one definition of what the HTTP API's tests
// send to the OpenAPI contract checker (checks/contract, a nested module
// that carries the OpenAPI library, run as openapi-check): one Exchange,
// JSON-encoded, a line. It imports only the standard library, so the
// tests of the root module reach the checker without building it.
package openapiwire

import "net/http"

// Mode says how much of an exchange the checker validates.
type Mode int

const (
	// All validates the request too: a request the document rejects must
	// not get a 2xx answer.
	All Mode = iota
	// AnswerOnly validates the answer only, for requests that use what
	// the server accepts beyond the document's words (the fuzzer's any
	// "+json" media type, or no Content-Type).
	AnswerOnly
)

// Exchange is one request and the answer it got, both read in full.
type Exchange struct {
	Method string `json:"method"`
	// Path, RawPath and RawQuery are the request URL's, so that the
	// escaped path is the one sent.
	Path     string      `json:"path"`
	RawPath  string      `json:"raw_path,omitempty"`
	RawQuery string      `json:"raw_query,omitempty"`
	Header   http.Header `json:"header,omitempty"`
	Body     []byte      `json:"body,omitempty"`
	Mode     Mode        `json:"mode"`

	Code         int         `json:"code"`
	AnswerHeader http.Header `json:"answer_header,omitempty"`
	Answer       []byte      `json:"answer,omitempty"`
}
