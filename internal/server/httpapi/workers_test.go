package httpapi

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// GET /v1/workers is Client.Roster: the test's worker with the workflows
// it serves, each workflow known and served by it; a backend that cannot
// read the roster is a 503.
func TestWorkersRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.do(http.MethodGet, "/v1/workers", nil, "")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	var r jetflow.Roster
	res.json(t, &r)
	want, err := b.client.Roster(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Len(t, r.Workers, 1, "%s", res.body)
	w := r.Workers[0]
	require.Equal(t, want.Workers[0].ID, w.ID)
	require.Equal(t, want.Workers[0].Name, w.Name)
	require.Equal(t, []string{"echo", "fails", "flaky", "hook", "keyed", "mailer", "reject", "signup", "strict", "waiter"}, w.Workflows)
	require.False(t, w.Since.IsZero())
	require.Len(t, r.Workflows, len(w.Workflows))
	for _, kw := range r.Workflows {
		require.True(t, slices.Contains(w.Workflows, kw.Workflow), kw.Workflow)
		require.Equal(t, []string{w.Name}, kw.Workers, kw.Workflow)
		require.Equal(t, w.Name, kw.FirstWorker, kw.Workflow)
	}

	s, err := New(Config{Backend: &fakeBackend{err: jetflow.ErrUnavailable}})
	require.NoError(t, err)
	res = doCtx(t, ctxT(t, 10*time.Second), newTestServer(t, s), http.MethodGet, "/v1/workers", nil, "")
	require.Equal(t, http.StatusServiceUnavailable, res.code)
	require.Equal(t, "1", res.header.Get("Retry-After"))
}

// GET /v1/engine is Client.EngineStatus: this version's protocol, the
// test's worker counted under it, none foreign, and a run parked on a wait
// counted under its workflow and the build that started it; a backend that
// cannot read it is a 503.
func TestEngineRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("waiter", "eng-1", `{"block":true}`).code)
	var st jetflow.EngineStatus
	require.Eventually(t, func() bool {
		res := b.do(http.MethodGet, "/v1/engine", nil, "")
		require.Equal(t, http.StatusOK, res.code, "%s", res.body)
		st = jetflow.EngineStatus{}
		res.json(t, &st)
		total := 0
		for _, n := range st.Builds["waiter"] {
			total += n
		}
		return total == 1
	}, 10*time.Second, 20*time.Millisecond, "the parked run counted by build: %+v", st)
	require.Equal(t, jetflow.EngineProtocol, st.Protocol)
	require.Equal(t, map[string]int{"3": 1}, st.Workers)
	require.Empty(t, st.Foreign)
	require.True(t, st.Ready())
	require.Zero(t, st.LegacyRuns)

	s, err := New(Config{Backend: &fakeBackend{err: jetflow.ErrUnavailable}})
	require.NoError(t, err)
	res := doCtx(t, ctxT(t, 10*time.Second), newTestServer(t, s), http.MethodGet, "/v1/engine", nil, "")
	require.Equal(t, http.StatusServiceUnavailable, res.code)
}
