package contract

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/httpapi"
)

// openapiPath is the HTTP API's document, from this package's directory.
const openapiPath = "../../internal/server/httpapi/openapi.yaml"

// openapiYAML reads the document.
func openapiYAML(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(openapiPath)
	require.NoError(t, err)
	return b
}

// loaded is the document's contract, loaded once per test binary.
var loaded = sync.OnceValues(func() (*Contract, error) {
	b, err := os.ReadFile(openapiPath)
	if err != nil {
		return nil, err
	}
	return New(b)
})

func requireContract(t *testing.T) *Contract {
	t.Helper()
	c, err := loaded()
	require.NoError(t, err)
	return c
}

// exchangeOf is req (its body reqBody) and the answer code, header, body.
func exchangeOf(req *http.Request, reqBody []byte, code int, header http.Header, body []byte) Exchange {
	return Exchange{
		Method: req.Method, Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery,
		Header: req.Header, Body: reqBody, Code: code, AnswerHeader: header, Answer: body,
	}
}

// openapi.yaml is a valid OpenAPI 3.1 document with servers, tags and a
// license, every operation tagged with a declared tag; and the validator
// refuses the document as it was before this check (a flow mapping whose
// comma split a description into a stray key, which the old yaml.v3 route
// test parsed without complaint).
func TestOpenAPIDocumentValid(t *testing.T) {
	t.Parallel()
	doc := requireContract(t).Doc()
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

	yamlDoc := openapiYAML(t)
	fixed := `output: { description: "The run's output, once completed." }`
	require.Equal(t, 1, bytes.Count(yamlDoc, []byte(fixed)))
	broken := bytes.Replace(yamlDoc, []byte(fixed), []byte(`output: { description: The run's output, once completed. }`), 1)
	loader := openapi3.NewLoader()
	old, err := loader.LoadFromData(broken)
	require.NoError(t, err, "it is YAML, only not the YAML meant")
	err = old.Validate(loader.Context)
	require.ErrorContains(t, err, "once completed.")
	_, err = New(broken)
	require.ErrorContains(t, err, "once completed.")
}

// Check accepts exchanges that keep to the document and refuses each way
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
	const (
		headerOutcome   = httpapi.HeaderOutcome
		headerRunStatus = httpapi.HeaderRunStatus
	)
	startH := jsonH("Location", "/v1/runs/r-1", headerOutcome, "created", headerRunStatus, "running")
	for _, tc := range []struct {
		name         string
		method, path string
		reqBody      string
		code         int
		header       http.Header
		body         string
		wantErr      string // "" when the exchange conforms
	}{
		{"run", "GET", "/v1/runs/r-1", "", 200, jsonH(headerRunStatus, "running"), run, ""},
		{"run without status", "GET", "/v1/runs/r-1", "", 200, jsonH(headerRunStatus, "running"), `{"run_id":"r-1"}`, "doesn't match schema"},
		{"run with bad run_id", "GET", "/v1/runs/r-1", "", 200, jsonH(headerRunStatus, "running"), strings.Replace(run, `"r-1"`, `"r.1"`, 1), "regular expression"},
		{"run without status header", "GET", "/v1/runs/r-1", "", 200, jsonH(), run, headerRunStatus},
		{"run status header not a status", "GET", "/v1/runs/r-1", "", 200, jsonH(headerRunStatus, "sleeping"), run, headerRunStatus},
		{"undocumented status", "GET", "/v1/runs/r-1", "", 418, problemH(), problem, "status is not supported"},
		{"504 is not documented", "GET", "/v1/runs/r-1/result", "", 504, problemH(), problem, "status is not supported"},
		{"still running", "GET", "/v1/runs/r-1/result", "", 202, jsonH("Retry-After", "1", headerRunStatus, "running"), run, ""},
		{"still running without Retry-After", "GET", "/v1/runs/r-1/result", "", 202, jsonH(headerRunStatus, "running"), run, "Retry-After"},
		{"unavailable", "GET", "/v1/runs", "", 503, problemH("Retry-After", "1"), problem, ""},
		{"unavailable without Retry-After", "GET", "/v1/runs", "", 503, problemH(), problem, "Retry-After"},
		{"problem as plain JSON", "GET", "/v1/runs", "", 503, jsonH("Retry-After", "1"), problem, "Content-Type"},
		{"started", "POST", "/v1/workflows/w/runs", `{}`, 201, startH, started, ""},
		{"started without Location", "POST", "/v1/workflows/w/runs", `{}`, 201, jsonH(headerOutcome, "created", headerRunStatus, "running"), started, "Location"},
		{"started, unknown outcome", "POST", "/v1/workflows/w/runs", `{}`, 201, jsonH("Location", "/v1/runs/r-1", headerOutcome, "maybe", headerRunStatus, "running"), started, headerOutcome},
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
				req.Header.Set(httpapi.HeaderIdempotencyKey, "r-1")
			}
			err := c.Check(exchangeOf(req, []byte(tc.reqBody), tc.code, tc.header, []byte(tc.body)))
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
	yamlDoc := openapiYAML(t)
	getRun := bytes.Index(yamlDoc, []byte("operationId: getRun\n"))
	require.Positive(t, getRun)
	at := bytes.Index(yamlDoc[getRun:], []byte(documented))
	require.Positive(t, at)
	at += getRun
	c, err := New(slices.Concat(yamlDoc[:at], yamlDoc[at+len(documented):]))
	require.NoError(t, err)
	answer := func(path string) Exchange {
		return exchangeOf(httptest.NewRequest(http.MethodPut, path, nil), nil, http.StatusMethodNotAllowed,
			http.Header{"Content-Type": {"application/problem+json"}, "Allow": {"GET, HEAD"}},
			[]byte(`{"type":"about:blank","title":"Method Not Allowed","status":405}`))
	}
	require.ErrorContains(t, c.Check(answer("/v1/runs/r-1")), "does not document")
	require.NoError(t, c.Check(answer("/v1/runs")))
	require.NoError(t, requireContract(t).Check(answer("/v1/runs/r-1")))
}

// An escaped path is routed as sent: a key "a/b" sent as "a%2Fb" is one
// path segment, and the exchange survives its trip through JSON.
func TestContractCheckRoutesTheEscapedPath(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest(http.MethodDelete, "/v1/task-keys/a%2Fb", nil)
	require.Equal(t, "a%2Fb", strings.TrimPrefix(req.URL.EscapedPath(), "/v1/task-keys/"))
	ex := exchangeOf(req, nil, http.StatusBadRequest, http.Header{"Content-Type": {"application/problem+json"}},
		[]byte(`{"type":"about:blank","title":"Bad Request","status":400}`))
	b, err := json.Marshal(ex)
	require.NoError(t, err)
	var back Exchange
	require.NoError(t, json.Unmarshal(b, &back))
	require.NoError(t, requireContract(t).Check(back))
	back.Code = http.StatusNotFound
	require.ErrorContains(t, requireContract(t).Check(back), "status is not supported")
}

// Serve says Ready, then answers each exchange with its verdict, in order.
func TestServe(t *testing.T) {
	t.Parallel()
	c := requireContract(t)
	good := exchangeOf(httptest.NewRequest(http.MethodGet, "/v2/x", nil), nil, 404,
		http.Header{"Content-Type": {"application/problem+json"}}, []byte(`{"type":"about:blank","title":"Not Found","status":404}`))
	bad := good
	bad.Code = 200
	var in bytes.Buffer
	for _, ex := range []Exchange{good, bad} {
		require.NoError(t, json.NewEncoder(&in).Encode(ex))
	}
	in.WriteString("not json\n")
	var out bytes.Buffer
	require.NoError(t, c.Serve(&in, &out))
	dec := json.NewDecoder(&out)
	var verdicts []Verdict
	for dec.More() {
		var v Verdict
		require.NoError(t, dec.Decode(&v))
		verdicts = append(verdicts, v)
	}
	require.Len(t, verdicts, 4)
	require.Equal(t, Verdict{Ready: true}, verdicts[0])
	require.Empty(t, verdicts[1].Error)
	require.Contains(t, verdicts[2].Error, "want 404")
	require.Contains(t, verdicts[3].Error, "does not decode")
}
