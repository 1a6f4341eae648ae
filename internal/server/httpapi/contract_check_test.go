package httpapi

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The checks of the contract check itself (what it accepts and refuses,
// and that openapi.yaml is a valid OpenAPI document) are in the checks
// module, with kin-openapi: checks/contract.

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
