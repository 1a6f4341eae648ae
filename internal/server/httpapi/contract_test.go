package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// The HTTP tests check every answer they get against openapi.yaml with a
// real OpenAPI implementation (kin-openapi): contractClient for requests
// sent to an httptest server, serveChecked for requests served into a
// recorder. A departure from the document fails the test that made the
// request, whatever the test itself asserts.

// contract is openapi.yaml as kin-openapi loads it, validated, with a
// router over its operations.
type contract struct {
	doc    *openapi3.T
	router routers.Router
}

// loadContract loads and validates openapi.yaml once per test binary.
var loadContract = sync.OnceValues(func() (*contract, error) { return newContract(openapiYAML) })

// newContract loads and validates the OpenAPI document data.
func newContract(data []byte) (*contract, error) {
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
	return &contract{doc: doc, router: router}, nil
}

// exchange is one request and the answer it got, both read in full.
type exchange struct {
	req     *http.Request
	reqBody []byte
	code    int
	header  http.Header
	body    []byte
}

// checkMode says how much of an exchange check validates.
type checkMode int

const (
	// checkAll validates the request too: a request the document
	// rejects must not get a 2xx answer.
	checkAll checkMode = iota
	// checkAnswer validates the answer only, for requests that use what
	// the server accepts beyond the document's words (the fuzzer's any
	// "+json" media type, or no Content-Type).
	checkAnswer
)

// check returns how ex departs from the document, nil when it does not.
// A request an operation matches gets an answer whose status that
// operation documents, with every required header, each documented header
// matching its schema, and a body of a documented content type matching
// its schema. A request no operation matches gets the NoRoute response of
// the components (unknown path), or a 405 that every operation of its
// path documents (known path, other method).
func (c *contract) check(ex exchange, mode checkMode) error {
	ctx := context.Background()
	// Route on the escaped path, as http.ServeMux does: a key sent as
	// "a%2Fb" is one path segment.
	routed := ex.req.Clone(ctx)
	routed.URL.Path = ex.req.URL.EscapedPath()
	routed.URL.RawPath = ""
	route, params, err := c.router.FindRoute(routed)
	if err != nil {
		return c.checkUnmatched(ex, err)
	}
	req := ex.req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(ex.reqBody))
	if len(ex.reqBody) > 0 && req.Header.Get("Content-Type") == "" {
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
	if mode == checkAll {
		if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil && ex.code < 400 {
			errs = append(errs, fmt.Errorf("answered %d to a request the document rejects: %w", ex.code, reqErr))
		}
	}
	return errors.Join(append(errs, c.checkAnswer(ctx, in, ex))...)
}

// checkUnmatched checks the answer to a request FindRoute found no
// operation for (routeErr says why).
func (c *contract) checkUnmatched(ex exchange, routeErr error) error {
	var re *routers.RouteError
	if !errors.As(routeErr, &re) {
		return fmt.Errorf("routing: %w", routeErr)
	}
	// kin-openapi's router tells a known path with another method
	// (ErrMethodNotAllowed) only for paths without parameters: the path
	// is known when an operation of another method matches it.
	item := c.pathItem(ex.req)
	want := http.StatusNotFound
	if item != nil {
		want = http.StatusMethodNotAllowed
	}
	if ex.code != want {
		return fmt.Errorf("no operation matches (%s): want %d, got %d", re.Reason, want, ex.code)
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
				return fmt.Errorf("answered 405 to %s %s, which %s %s does not document", ex.req.Method, ex.req.URL.Path, method, ex.req.URL.Path)
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
		Path:      ex.req.URL.Path,
		Method:    ex.req.Method,
		Operation: &openapi3.Operation{Responses: openapi3.NewResponses(openapi3.WithStatus(want, resp))},
	}
	in := &openapi3filter.RequestValidationInput{Request: ex.req, Route: route}
	return c.checkAnswer(context.Background(), in, ex)
}

// pathItem is the document's path item for req's path, found through an
// operation of another method; nil when none has the path.
func (c *contract) pathItem(req *http.Request) *openapi3.PathItem {
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
func (c *contract) checkAnswer(ctx context.Context, in *openapi3filter.RequestValidationInput, ex exchange) error {
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 ex.code,
		Header:                 ex.header,
		Options: &openapi3filter.Options{
			MultiError:            true,
			IncludeResponseStatus: true, // an undocumented status is an error
		},
	}
	out.SetBodyBytes(ex.body)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return fmt.Errorf("answer %d: %w", ex.code, err)
	}
	return nil
}

// requireContract returns the loaded document, failing t if it does not
// load or validate.
func requireContract(t testing.TB) *contract {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reportExchange fails t (without stopping it: it may run on the client's
// goroutine) when ex departs from the document.
func reportExchange(t testing.TB, ex exchange, mode checkMode) {
	t.Helper()
	c, err := loadContract()
	if err == nil {
		err = c.check(ex, mode)
	}
	if err != nil {
		t.Errorf("%s %s: against openapi.yaml: %v\nbody: %s", ex.req.Method, ex.req.URL.RequestURI(), err, ex.body)
	}
}

// contractTransport is an http.RoundTripper that checks every exchange it
// carries against openapi.yaml, failing t on a departure.
type contractTransport struct {
	t    testing.TB
	base http.RoundTripper
}

// RoundTrip sends req through the base transport and checks the exchange.
// The answer's body is read in full before it is returned.
func (ct contractTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	sent := req
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		if err := req.Body.Close(); err != nil {
			return nil, err
		}
		sent = req.Clone(req.Context())
		sent.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	res, err := ct.base.RoundTrip(sent)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(res.Body)
	if cerr := res.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	reportExchange(ct.t, exchange{req: req, reqBody: reqBody, code: res.StatusCode, header: res.Header, body: body}, checkAll)
	return res, nil
}

// contractClient is srv's client with every exchange checked against
// openapi.yaml.
func contractClient(t testing.TB, srv *httptest.Server) *http.Client {
	return &http.Client{Transport: contractTransport{t: t, base: srv.Client().Transport}}
}

// serveChecked serves req with h into a recorder and checks the exchange
// against openapi.yaml in mode.
func serveChecked(t testing.TB, h http.Handler, req *http.Request, mode checkMode) *httptest.ResponseRecorder {
	t.Helper()
	var reqBody []byte
	if req.Body != nil {
		var err error
		if reqBody, err = io.ReadAll(req.Body); err != nil {
			t.Fatal(err)
		}
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	reportExchange(t, exchange{req: req, reqBody: reqBody, code: rec.Code, header: rec.Result().Header, body: rec.Body.Bytes()}, mode)
	return rec
}
