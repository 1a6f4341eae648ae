package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jetflow/jetflow/internal/testsupport/openapiwire"
)

// The HTTP tests check every answer they get against openapi.yaml with a
// real OpenAPI implementation (kin-openapi): contractClient for requests
// sent to an httptest server, serveChecked for requests served into a
// recorder. A departure from the document fails the test that made the
// request, whatever the test itself asserts.
//
// kin-openapi is in the checks module (checks/contract), not in jetflow's
// module graph: the first check of a test binary starts its command,
// openapi-check, with go run in checks/ (built once, then cached), and
// every exchange is sent to it and its verdict read back, one JSON object
// a line each way. The checks of the checker itself, and that the
// document is a valid OpenAPI document, are checks/contract's tests.

// checksDir is the checks module, from this package's directory.
const checksDir = "../../../checks"

// contract is a running openapi-check over openapi.yaml.
type contract struct {
	mu  sync.Mutex // one exchange at a time
	enc *json.Encoder
	dec *json.Decoder
}

// loadContract starts openapi-check once per test binary; the command
// ends when the test binary does (its input closes).
var loadContract = sync.OnceValues(func() (*contract, error) {
	doc, err := filepath.Abs("openapi.yaml")
	if err != nil {
		return nil, err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("openapi-check: %w", err)
	}
	cmd := exec.Command(goTool, "run", "./contract/cmd/openapi-check", doc)
	cmd.Dir = checksDir
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("openapi-check: %w", err)
	}
	c := &contract{enc: json.NewEncoder(in), dec: json.NewDecoder(bufio.NewReader(out))}
	var ready verdict
	if err := c.dec.Decode(&ready); err != nil {
		return nil, fmt.Errorf("openapi-check (go run in checks/) did not start: %w", err)
	}
	if !ready.Ready {
		return nil, fmt.Errorf("openapi-check: %s", ready.Error)
	}
	return c, nil
})

// exchange is one request and the answer it got, both read in full.
type exchange struct {
	req     *http.Request
	reqBody []byte
	code    int
	header  http.Header
	body    []byte
}

// checkMode says how much of an exchange check validates.
type checkMode = openapiwire.Mode

const (
	checkAll    = openapiwire.All
	checkAnswer = openapiwire.AnswerOnly
)

// verdict is openapi-check's answer (contract.Verdict).
type verdict struct {
	Ready bool   `json:"ready,omitempty"`
	Error string `json:"error,omitempty"`
}

// check returns how ex departs from the document, nil when it does not:
// openapi-check's verdict (contract.Contract.Check says what it checks).
func (c *contract) check(ex exchange, mode checkMode) error {
	w := openapiwire.Exchange{
		Method: ex.req.Method, Path: ex.req.URL.Path, RawPath: ex.req.URL.RawPath, RawQuery: ex.req.URL.RawQuery,
		Header: ex.req.Header, Body: ex.reqBody, Mode: mode, Code: ex.code, AnswerHeader: ex.header, Answer: ex.body,
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.enc.Encode(w); err != nil {
		return fmt.Errorf("openapi-check: %w", err)
	}
	var v verdict
	if err := c.dec.Decode(&v); err != nil {
		return fmt.Errorf("openapi-check: %w", err)
	}
	if v.Error != "" {
		return errors.New(v.Error)
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
