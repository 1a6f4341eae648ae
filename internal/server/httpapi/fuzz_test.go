package httpapi

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// fuzzMaxBody is the body limit of the fuzzed server, small so that the
// fuzzer reaches it.
const fuzzMaxBody = 256

// FuzzHTTPStart sends POST /v1/workflows/wf/runs with any Idempotency-Key,
// Content-Type and body to a server on a fake backend. It must never
// panic, must answer 201 or a 4xx problem, and must call StartByName
// exactly when the key (a bare run ID, or a run ID quoted as a
// structured-field string), the content type (absent or JSON) and the body
// (empty or JSON, within the limit) are all acceptable, with the body as
// the input; every answer conforms to openapi.yaml. Seeds: testdata/fuzz/FuzzHTTPStart.
func FuzzHTTPStart(f *testing.F) {
	f.Fuzz(func(t *testing.T, key, contentType string, body []byte) {
		backend := &fakeBackend{}
		s, err := New(Config{Backend: backend})
		require.NoError(t, err)
		s.maxBody = fuzzMaxBody

		req := httptest.NewRequest(http.MethodPost, "/v1/workflows/wf/runs", bytes.NewReader(body))
		if key != "" {
			req.Header[HeaderIdempotencyKey] = []string{key}
		}
		if contentType != "" {
			req.Header["Content-Type"] = []string{contentType}
		}
		// The answer, whatever the input, conforms to openapi.yaml; the
		// request may use what the server accepts beyond the document's
		// words (any +json media type, no Content-Type).
		rec := serveChecked(t, s, req, checkAnswer)

		starts := backend.startCalls()
		acceptable := keyAcceptable(key) && contentTypeAcceptable(contentType) && bodyAcceptable(body)
		if !acceptable {
			require.Empty(t, starts, "malformed request reached StartByName")
			require.True(t, rec.Code >= 400 && rec.Code < 500, "status %d", rec.Code)
			require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
			var p Problem
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
			require.Equal(t, rec.Code, p.Status)
			return
		}
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		require.Len(t, starts, 1)
		require.Equal(t, "wf", starts[0].name)
		if len(bytes.Trim(body, " \t\r\n")) == 0 {
			require.Equal(t, "null", string(starts[0].input))
		} else {
			require.Equal(t, body, []byte(starts[0].input))
		}
	})
}

// keyAcceptable is the oracle for the Idempotency-Key header: (around
// optional spaces and tabs) a valid run ID, bare or in double quotes.
// Escapes can only produce '"' and '\', which no run ID has. Absent is
// refused: the fuzzed requests do not ask for a generated run ID.
func keyAcceptable(key string) bool {
	if key == "" {
		return false
	}
	v := strings.Trim(key, " \t")
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	return state.ValidateRunID(v) == nil
}

func contentTypeAcceptable(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

func bodyAcceptable(body []byte) bool {
	return len(body) <= fuzzMaxBody && (len(bytes.Trim(body, " \t\r\n")) == 0 || json.Valid(body))
}
