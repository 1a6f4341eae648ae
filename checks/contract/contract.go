// Package contract checks HTTP exchanges against the HTTP API's OpenAPI
// document (internal/server/httpapi/openapi.yaml) with a real OpenAPI
// implementation, kin-openapi. It is in the checks module so that
// kin-openapi is in no build of a program that imports jetflow: the tests
// of internal/server/httpapi run its command, openapi-check, and send it
// every exchange they make (Serve's protocol), so that a departure from
// the document fails the test that made the request.
package contract

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/jetflow/jetflow/internal/testsupport/openapiwire"
)

// Contract is an OpenAPI document as kin-openapi loads it, validated, with
// a router over its operations.
type Contract struct {
	doc    *openapi3.T
	router routers.Router
}

// New loads and validates the OpenAPI document data.
func New(data []byte) (*Contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml does not load: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("openapi.yaml is not a valid OpenAPI document: %w", err)
	}
	// Route by path alone: test servers listen on ports of their own, not
	// on the documented server URL.
	byPath := *doc
	byPath.Servers = nil
	router, err := legacy.NewRouter(&byPath)
	if err != nil {
		return nil, fmt.Errorf("openapi.yaml: no router: %w", err)
	}
	return &Contract{doc: doc, router: router}, nil
}

// Doc is the loaded document.
func (c *Contract) Doc() *openapi3.T { return c.doc }

// Mode and Exchange are the wire's (internal/testsupport/openapiwire):
// what the httpapi tests send, one JSON object a line.
type (
	Mode     = openapiwire.Mode
	Exchange = openapiwire.Exchange
)

// The modes of an exchange.
const (
	All        = openapiwire.All
	AnswerOnly = openapiwire.AnswerOnly
)

// request is ex's request, its body unread.
func request(ex Exchange) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/", bytes.NewReader(ex.Body))
	req.Method = ex.Method
	req.URL = &url.URL{Path: ex.Path, RawPath: ex.RawPath, RawQuery: ex.RawQuery}
	req.RequestURI = req.URL.RequestURI()
	req.Header = ex.Header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.ContentLength = int64(len(ex.Body))
	return req
}

// Check returns how ex departs from the document, nil when it does not.
// A request an operation matches gets an answer whose status that
// operation documents, with every required header, each documented header
// matching its schema, and a body of a documented content type matching
// its schema. A request no operation matches gets the NoRoute response of
// the components (unknown path), or a 405 that every operation of its
// path documents (known path, other method).
func (c *Contract) Check(ex Exchange) error {
	ctx := context.Background()
	orig := request(ex)
	// Route on the escaped path, as http.ServeMux does: a key sent as
	// "a%2Fb" is one path segment.
	routed := orig.Clone(ctx)
	routed.URL.Path = orig.URL.EscapedPath()
	routed.URL.RawPath = ""
	route, params, err := c.router.FindRoute(routed)
	if err != nil {
		return c.checkUnmatched(ex, orig, err)
	}
	req := orig.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(ex.Body))
	if len(ex.Body) > 0 && req.Header.Get("Content-Type") == "" {
		// The server reads a body without a Content-Type as JSON (the
		// 415 answer's description says so); OpenAPI has no words for it.
		req.Header.Set("Content-Type", "application/json")
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			MultiError: true,
			// Authentication is the server's business (Config.Tokens),
			// tested on its own; the document only names the scheme.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
		},
	}
	var errs []error
	if ex.Mode == All {
		if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil && ex.Code < 400 {
			errs = append(errs, fmt.Errorf("answered %d to a request the document rejects: %w", ex.Code, reqErr))
		}
	}
	return errors.Join(append(errs, c.checkAnswer(ctx, in, ex))...)
}

// checkUnmatched checks the answer to a request (req, ex's) FindRoute
// found no operation for (routeErr says why).
func (c *Contract) checkUnmatched(ex Exchange, req *http.Request, routeErr error) error {
	var re *routers.RouteError
	if !errors.As(routeErr, &re) {
		return fmt.Errorf("routing: %w", routeErr)
	}
	// kin-openapi's router tells a known path with another method
	// (ErrMethodNotAllowed) only for paths without parameters: the path
	// is known when an operation of another method matches it.
	item := c.pathItem(req)
	want := http.StatusNotFound
	if item != nil {
		want = http.StatusMethodNotAllowed
	}
	if ex.Code != want {
		return fmt.Errorf("no operation matches (%s): want %d, got %d", re.Reason, want, ex.Code)
	}
	resp := c.doc.Components.Responses["NoRoute"]
	if item != nil {
		// The path's answer to the other methods: every operation of the
		// path documents it (OpenAPI has no responses per path), so that a
		// client generated from any of them knows it.
		resp = nil
		for method, op := range item.Operations() {
			r := op.Responses.Status(want)
			if r == nil {
				return fmt.Errorf("answered 405 to %s %s, which %s %s does not document", req.Method, req.URL.Path, method, req.URL.Path)
			}
			resp = r
		}
	}
	if resp == nil {
		return fmt.Errorf("no documented response for %d", want)
	}
	// An operation of its own for the answer, so that kin-openapi checks
	// it exactly as it checks an operation's.
	route := &routers.Route{
		Spec:      c.doc,
		Path:      req.URL.Path,
		Method:    req.Method,
		Operation: &openapi3.Operation{Responses: openapi3.NewResponses(openapi3.WithStatus(want, resp))},
	}
	in := &openapi3filter.RequestValidationInput{Request: req, Route: route}
	return c.checkAnswer(context.Background(), in, ex)
}

// pathItem is the document's path item for req's path, found through an
// operation of another method; nil when none has the path.
func (c *Contract) pathItem(req *http.Request) *openapi3.PathItem {
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		other := req.Clone(context.Background())
		other.Method = method
		other.URL.Path = req.URL.EscapedPath()
		other.URL.RawPath = ""
		if route, _, err := c.router.FindRoute(other); err == nil {
			return route.PathItem
		}
	}
	return nil
}

// checkAnswer validates the status, headers and body of ex's answer
// against in's operation.
func (c *Contract) checkAnswer(ctx context.Context, in *openapi3filter.RequestValidationInput, ex Exchange) error {
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 ex.Code,
		Header:                 ex.AnswerHeader,
		Options: &openapi3filter.Options{
			MultiError:            true,
			IncludeResponseStatus: true, // an undocumented status is an error
		},
	}
	out.SetBodyBytes(ex.Answer)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Errorf("answer %d: %w", ex.Code, err)
	}
	return nil
}

// Verdict is openapi-check's answer, one JSON object a line: first to the
// document (Ready, or Error when it does not load or validate), then to
// each exchange (Error empty when it keeps to the document).
type Verdict struct {
	Ready bool   `json:"ready,omitempty"`
	Error string `json:"error,omitempty"`
}

// Serve answers each exchange read from in, one JSON object a line, with
// its Verdict on out, until in ends. It first writes Ready.
func (c *Contract) Serve(in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	if err := enc.Encode(Verdict{Ready: true}); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<30)
	for sc.Scan() {
		var ex Exchange
		var v Verdict
		if err := json.Unmarshal(sc.Bytes(), &ex); err != nil {
			v.Error = fmt.Sprintf("openapi-check: an exchange that does not decode: %v", err)
		} else if err := c.Check(ex); err != nil {
			v.Error = err.Error()
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return sc.Err()
}
