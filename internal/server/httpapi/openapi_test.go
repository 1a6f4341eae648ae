package httpapi

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// openapiDoc is what the route tests read of openapi.yaml: its version
// and, for each path and method (lower case, as written), the operation.
// Whether the document is a valid OpenAPI document is checked by
// kin-openapi, when the contract check loads it (requireContract) and in
// checks/contract.
type openapiDoc struct {
	OpenAPI string                                 `yaml:"openapi"`
	Paths   map[string]map[string]openapiOperation `yaml:"paths"`
}

// openapiOperation is what the route tests read of an operation.
type openapiOperation struct {
	Deprecated bool                   `yaml:"deprecated"`
	Security   *[]map[string][]string `yaml:"security"` // nil: the document's
	Responses  map[string]any         `yaml:"responses"`
}

// loadDoc decodes openapi.yaml, failing t if it does not decode or the
// contract check refuses it.
func loadDoc(t testing.TB) openapiDoc {
	t.Helper()
	requireContract(t)
	var doc openapiDoc
	require.NoError(t, yaml.Unmarshal(openapiYAML, &doc))
	return doc
}

// documentedCodes maps each route pattern openapi.yaml documents to the
// set of status codes it documents for it.
func documentedCodes(t testing.TB) map[string]map[string]bool {
	t.Helper()
	out := make(map[string]map[string]bool)
	for path, item := range loadDoc(t).Paths {
		for method, op := range item {
			codes := make(map[string]bool)
			for code := range op.Responses {
				codes[code] = true
			}
			out[strings.ToUpper(method)+" "+path] = codes
		}
	}
	return out
}

// The document describes exactly the routes the server registers.
func TestOpenAPIMatchesRouteTable(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	require.Equal(t, "3.1.0", doc.OpenAPI)
	var documented, served []string
	for pattern := range documentedCodes(t) {
		documented = append(documented, pattern)
	}
	for _, rt := range routes {
		served = append(served, rt.pattern())
	}
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, documented)

	// Public routes say so; the others inherit the bearer scheme. The
	// deprecated aliases, and only they, are marked deprecated.
	for _, rt := range routes {
		op, ok := doc.Paths[rt.path][strings.ToLower(rt.method)]
		require.True(t, ok, rt.pattern())
		require.Equal(t, rt.deprecated, op.Deprecated, "%s: deprecated", rt.pattern())
		if rt.public {
			require.NotNil(t, op.Security, rt.pattern())
			require.Empty(t, *op.Security, "%s is public", rt.pattern())
		} else {
			require.Nil(t, op.Security, "%s needs the bearer token", rt.pattern())
		}
	}
}

// Every route documents exactly the codes it can answer: none missing (the
// tests also check every answer they get, contractClient), none it never
// gives (no 504: a request that runs out of time is a 503). Every route
// lists 405, its path's answer to the methods it does not have
// (TestEveryPathAnswers405).
func TestOpenAPIDocumentsStatusCodes(t *testing.T) {
	t.Parallel()
	common := []int{http.StatusUnauthorized, http.StatusMethodNotAllowed, http.StatusInternalServerError, http.StatusServiceUnavailable}
	want := map[string][]int{
		"POST /v1/workflows/{name}/runs":    append([]int{201, 400, 404, 409, 413, 415, 422}, common...),
		"GET /v1/runs":                      append([]int{200, 400}, common...),
		"GET /v1/runs/counts":               append([]int{200, 400}, common...),
		"GET /v1/runs/{id}":                 append([]int{200, 400, 403, 404}, common...),
		"GET /v1/runs/{id}/result":          append([]int{200, 202, 400, 404}, common...),
		"POST /v1/runs/{id}/cancel":         append([]int{200, 400, 403, 404, 409}, common...),
		"POST /v1/runs/{id}/unblock":        append([]int{200, 400, 403, 404, 409, 413, 415, 422}, common...),
		"POST /v1/runs/{id}/rerun":          append([]int{200, 201, 400, 403, 404, 409, 413, 415, 422}, common...),
		"POST /v1/runs/{id}/events/{name}":  append([]int{200, 400, 403, 404, 409, 413, 415, 422}, common...),
		"POST /v1/hooks/{token}":            append([]int{200, 400, 403, 404, 409, 413, 415, 422}, common...),
		"GET /v1/workers":                   append([]int{200}, common...),
		"GET /v1/engine":                    append([]int{200}, common...),
		"DELETE /v1/task-keys/{key}":        append([]int{200, 400}, common...),
		"DELETE /v1/idempotency-keys/{key}": append([]int{200, 400}, common...),
		"POST /v1/webhooks/{source}":        {200, 202, 400, 401, 404, 405, 409, 413, 422, 500, 503},
		"GET /v1/openapi.yaml":              {200, 405},
	}
	got := documentedCodes(t)
	require.Len(t, want, len(routes))
	for pattern, codes := range want {
		wantSet := make(map[string]bool)
		for _, c := range codes {
			wantSet[strconv.Itoa(c)] = true
		}
		require.Equal(t, wantSet, got[pattern], pattern)
	}
	// Every error status the handlers map to is documented somewhere.
	for _, e := range errorStatuses {
		found := false
		for _, codes := range got {
			found = found || codes[strconv.Itoa(e.status)]
		}
		require.True(t, found, "status %d (for %v) is documented nowhere", e.status, e.err)
	}
}

func TestServeOpenAPI(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Backend: &fakeBackend{}, Tokens: []string{"secret-token"}})
	require.NoError(t, err)
	srv := newTestServer(t, s)
	res := doCtx(t, ctxT(t, 10*time.Second), srv, http.MethodGet, "/v1/openapi.yaml", nil, "")
	require.Equal(t, http.StatusOK, res.code, "public: no token needed")
	require.Equal(t, "application/yaml", res.header.Get("Content-Type"))
	require.Equal(t, openapiYAML, res.body)
}

// Every path of the route table answers a method it does not have with
// 405, Allow naming exactly the methods its routes have (HEAD with GET),
// before authentication; the answer keeps to the document, where every
// operation of the path lists that 405 (contract.check).
func TestEveryPathAnswers405(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Backend: &fakeBackend{}, Tokens: []string{"secret-token"}})
	require.NoError(t, err)
	methods := map[string][]string{}
	for _, rt := range routes {
		methods[rt.path] = append(methods[rt.path], rt.method)
		if rt.method == http.MethodGet {
			methods[rt.path] = append(methods[rt.path], http.MethodHead)
		}
	}
	segment := regexp.MustCompile(`\{[a-z]+\}`)
	for path, allowed := range methods {
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if slices.Contains(allowed, method) {
				continue
			}
			concrete := segment.ReplaceAllString(path, "x-1")
			t.Run(method+" "+path, func(t *testing.T) {
				t.Parallel()
				rec := serveChecked(t, s, httptest.NewRequest(method, concrete, nil), checkAll)
				require.Equal(t, http.StatusMethodNotAllowed, rec.Code, rec.Body.String())
				got := strings.Split(rec.Header().Get("Allow"), ", ")
				require.ElementsMatch(t, allowed, got, "Allow")
			})
		}
	}
}
