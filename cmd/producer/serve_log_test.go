package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeAccessLog: producer serve echoes a request's X-Request-Id (or
// makes one) and logs one JSON access line per API request with it, the
// route, the status, the duration with its unit and the run's workflow and
// run ID, a start refused for its input included. No line carries an
// empty run_id.
func TestServeAccessLog(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	base, logs, stop := startServe(t, tb, nil)
	post := func(key, reqID, input string) response {
		h := http.Header{"Idempotency-Key": {key}, "Content-Type": {"application/json"}}
		if reqID != "" {
			h.Set("X-Request-Id", reqID)
		}
		return do(t, http.MethodPost, base+"/v1/workflows/greet/runs", h, []byte(input))
	}
	ok := post("http-log-1", "req-42", `{"name":"ada"}`)
	require.Equal(t, http.StatusCreated, ok.code, ok.body)
	require.Equal(t, "req-42", ok.header.Get("X-Request-Id"))
	bad := post("http-log-2", "", `{"name":7}`)
	require.Equal(t, http.StatusBadRequest, bad.code, bad.body)
	badID := bad.header.Get("X-Request-Id")
	require.Len(t, badID, 16, "a generated request ID")
	missing := do(t, http.MethodGet, base+"/v1/runs/nope", nil, nil)
	require.Equal(t, http.StatusNotFound, missing.code)
	require.NoError(t, stop())

	access := map[string]map[string]any{} // by request ID
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var l map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), sc.Text())
		if v, has := l["run_id"]; has {
			require.NotEmpty(t, v, "a line with an empty run_id: %s", sc.Text())
		}
		if l["message"] == "request" {
			access[l["request_id"].(string)] = l
		}
	}
	require.Len(t, access, 3, "one access line per request:\n%s", logs)
	for id, want := range map[string]map[string]any{
		"req-42":                           {"method": "POST", "route": "POST /v1/workflows/{name}/runs", "workflow": "greet", "run_id": "http-log-1", "status": 201.0},
		badID:                              {"route": "POST /v1/workflows/{name}/runs", "workflow": "greet", "run_id": "http-log-2", "status": 400.0},
		missing.header.Get("X-Request-Id"): {"method": "GET", "route": "GET /v1/runs/{id}", "run_id": "nope", "status": 404.0},
	} {
		l := access[id]
		require.NotNil(t, l, "no access line for request %s", id)
		for k, v := range want {
			require.Equal(t, v, l[k], "request %s: %s", id, k)
		}
		require.Regexp(t, `^[0-9.]+(µs|ms|s)$`, l["took"], "took carries its unit")
	}
}
