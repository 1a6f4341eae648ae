package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// openapi.yaml is a valid OpenAPI 3.1 document with servers, tags and a
// license, every operation tagged with a declared tag; and the validator
// refuses the document as it was before this check (a flow mapping whose
// comma split a description into a stray key, which the old yaml.v3 route
// test parsed without complaint).
func TestOpenAPIDocumentValid(t *testing.T) {
	t.Parallel()
	doc := requireContract(t).doc
	require.NotEmpty(t, doc.Servers)
	require.NotNil(t, doc.Info.License)
	require.NotEmpty(t, doc.Info.License.Name)
	declared := make(map[string]bool)
	for _, tag := range doc.Tags {
		declared[tag.Name] = true
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			require.NotEmpty(t, op.Tags, "%s %s has no tag", method, path)
			for _, tag := range op.Tags {
				require.True(t, declared[tag], "%s %s: tag %q is not declared", method, path, tag)
			}
		}
	}

	fixed := `output: { description: "The run's output, once completed." }`
	require.Equal(t, 1, bytes.Count(openapiYAML, []byte(fixed)))
	broken := bytes.Replace(openapiYAML, []byte(fixed), []byte(`output: { description: The run's output, once completed. }`), 1)
	loader := openapi3.NewLoader()
	old, err := loader.LoadFromData(broken)
	require.NoError(t, err, "it is YAML, only not the YAML meant")
	err = old.Validate(loader.Context)
	require.ErrorContains(t, err, "once completed.")
}

// check accepts exchanges that keep to the document and refuses each way
// of breaking it: status, required header, header schema, content type,
// body schema, unmatched routes, and a 2xx to a request the document
// rejects.
func TestContractCheckRefusesDepartures(t *testing.T) {
	t.Parallel()
	c := requireContract(t)
	const (
		run     = `{"run_id":"r-1","workflow":"w","status":"running","created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z","generation":0,"duplicates":0}`
		problem = `{"type":"about:blank","title":"Service Unavailable","status":503}`
		started = `{"run_id":"r-1","workflow":"w","links":{"run":"/v1/runs/r-1","result":"/v1/runs/r-1/result"}}`
	)
	jsonH := func(kv ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	problemH := func(kv ...string) http.Header {
		h := jsonH(kv...)
		h.Set("Content-Type", "application/problem+json")
		return h
	}
	startH := jsonH("Location", "/v1/runs/r-1", HeaderOutcome, "created", HeaderRunStatus, "running")
	for _, tc := range []struct {
		name         string
		method, path string
		reqBody      string
		code         int
		header       http.Header
		body         string
		wantErr      string // "" when the exchange conforms
	}{
		{"run", "GET", "/v1/runs/r-1", "", 200, jsonH(HeaderRunStatus, "running"), run, ""},
		{"run without status", "GET", "/v1/runs/r-1", "", 200, jsonH(HeaderRunStatus, "running"), `{"run_id":"r-1"}`, "doesn't match schema"},
		{"run with bad run_id", "GET", "/v1/runs/r-1", "", 200, jsonH(HeaderRunStatus, "running"), strings.Replace(run, `"r-1"`, `"r.1"`, 1), "regular expression"},
		{"run without status header", "GET", "/v1/runs/r-1", "", 200, jsonH(), run, HeaderRunStatus},
		{"run status header not a status", "GET", "/v1/runs/r-1", "", 200, jsonH(HeaderRunStatus, "sleeping"), run, HeaderRunStatus},
		{"undocumented status", "GET", "/v1/runs/r-1", "", 418, problemH(), problem, "status is not supported"},
		{"504 is not documented", "GET", "/v1/runs/r-1/result", "", 504, problemH(), problem, "status is not supported"},
		{"still running", "GET", "/v1/runs/r-1/result", "", 202, jsonH("Retry-After", "1", HeaderRunStatus, "running"), run, ""},
		{"still running without Retry-After", "GET", "/v1/runs/r-1/result", "", 202, jsonH(HeaderRunStatus, "running"), run, "Retry-After"},
		{"unavailable", "GET", "/v1/runs", "", 503, problemH("Retry-After", "1"), problem, ""},
		{"unavailable without Retry-After", "GET", "/v1/runs", "", 503, problemH(), problem, "Retry-After"},
		{"problem as plain JSON", "GET", "/v1/runs", "", 503, jsonH("Retry-After", "1"), problem, "Content-Type"},
		{"started", "POST", "/v1/workflows/w/runs", `{}`, 201, startH, started, ""},
		{"started without Location", "POST", "/v1/workflows/w/runs", `{}`, 201, jsonH(HeaderOutcome, "created", HeaderRunStatus, "running"), started, "Location"},
		{"started, unknown outcome", "POST", "/v1/workflows/w/runs", `{}`, 201, jsonH("Location", "/v1/runs/r-1", HeaderOutcome, "maybe", HeaderRunStatus, "running"), started, HeaderOutcome},
		{"2xx to a request the document rejects", "GET", "/v1/runs?limit=1000", "", 200, jsonH(), `{"runs":[]}`, "request the document rejects"},
		{"4xx to a request the document rejects", "GET", "/v1/runs?limit=1000", "", 400, problemH(), strings.Replace(problem, "503", "400", 1), ""},
		{"no such path", "GET", "/v2/x", "", 404, problemH(), strings.Replace(problem, "503", "404", 1), ""},
		{"no such path answered 200", "GET", "/v2/x", "", 200, jsonH(), `{}`, "want 404"},
		{"no such method", "PUT", "/v1/runs", "", 405, problemH("Allow", "GET, HEAD"), strings.Replace(problem, "503", "405", 1), ""},
		{"no such method without Allow", "PUT", "/v1/runs", "", 405, problemH(), strings.Replace(problem, "503", "405", 1), "Allow"},
		{"no such method answered 404", "PUT", "/v1/runs", "", 404, problemH(), strings.Replace(problem, "503", "404", 1), "want 405"},
		{"no such method on a run", "PUT", "/v1/runs/r-1", "", 405, problemH("Allow", "GET, HEAD"), strings.Replace(problem, "503", "405", 1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.reqBody))
			if tc.reqBody != "" {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(HeaderIdempotencyKey, "r-1")
			}
			err := c.check(exchange{req: req, reqBody: []byte(tc.reqBody), code: tc.code, header: tc.header, body: []byte(tc.body)}, checkAll)
			if tc.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}

// A 405 keeps to the document only where every operation of its path
// documents it: the check refuses the answer against a document whose
// GET /v1/runs/{id} does not list 405, and accepts it for another path.
func TestContractCheckRequiresDocumented405(t *testing.T) {
	t.Parallel()
	const documented = `        "405": { $ref: "#/components/responses/MethodNotAllowed" }
`
	getRun := bytes.Index(openapiYAML, []byte("operationId: getRun\n"))
	require.Positive(t, getRun)
	at := bytes.Index(openapiYAML[getRun:], []byte(documented))
	require.Positive(t, at)
	at += getRun
	c, err := newContract(slices.Concat(openapiYAML[:at], openapiYAML[at+len(documented):]))
	require.NoError(t, err)
	answer := func(path string) exchange {
		return exchange{
			req: httptest.NewRequest(http.MethodPut, path, nil), code: http.StatusMethodNotAllowed,
			header: http.Header{"Content-Type": {"application/problem+json"}, "Allow": {"GET, HEAD"}},
			body:   []byte(`{"type":"about:blank","title":"Method Not Allowed","status":405}`),
		}
	}
	require.ErrorContains(t, c.check(answer("/v1/runs/r-1"), checkAll), "does not document")
	require.NoError(t, c.check(answer("/v1/runs"), checkAll))
	require.NoError(t, requireContract(t).check(answer("/v1/runs/r-1"), checkAll))
}

// recordingTB is a testing.TB whose Errorf is recorded, not reported.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errors...)
}

// contractClient fails its test on an answer that breaks the document and
// only then: here a server whose run body lacks its status, next to the
// real server's answer.
func TestContractClientFailsOnBrokenAnswer(t *testing.T) {
	t.Parallel()
	broken := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(HeaderRunStatus, "running")
		writeJSON(w, http.StatusOK, "application/json", map[string]string{"run_id": "r-1", "workflow": "w"})
	}))
	rec := &recordingTB{TB: t}
	res, err := contractClient(rec, broken).Get(broken.URL + "/v1/runs/r-1")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusOK, res.StatusCode, "the answer itself is passed on")
	errs := rec.recorded()
	require.Len(t, errs, 1)
	require.Contains(t, errs[0], "GET /v1/runs/r-1")
	require.Contains(t, errs[0], "doesn't match schema")

	s, err := New(Config{Backend: &fakeBackend{}})
	require.NoError(t, err)
	real := newTestServer(t, s)
	ok := &recordingTB{TB: t}
	for _, path := range []string{"/v1/runs", "/v1/runs/r-1", "/v1/openapi.yaml", "/v2/x"} {
		req, err := http.NewRequestWithContext(ctxT(t, 10*time.Second), http.MethodGet, real.URL+path, nil)
		require.NoError(t, err)
		res, err := contractClient(ok, real).Do(req)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
	}
	require.Empty(t, ok.recorded())
}
