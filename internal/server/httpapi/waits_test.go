package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// GET /v1/runs/{id} says what a waiting run waits for, since when, and
// lists an event that ended a wait where the wait stands in call order:
// after the step that ran before it, before the step after it.
func TestRunWaitsAndCallOrderHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.post("waiter", "wt-1", `{"block":true}`).code)
	b.release()

	d := b.waitOpen("wt-1")
	require.Equal(t, []jetflow.OpenWait{{StepID: "wt-1.event=paid.0", Name: "event=paid", Kind: "event", Event: "paid", Since: d.Waits[0].Since}}, d.Waits)
	require.False(t, d.Waits[0].Since.IsZero())
	require.Equal(t, []string{"hold"}, names(d.Steps))

	b.event(sendPath("wt-1", "paid"), "pay-1", `{"ref":"r-1"}`).delivery(t)
	b.waitDone("wt-1")
	d = b.describe("wt-1")
	require.Equal(t, []string{"hold", "event=paid", "after"}, names(d.Steps))
	require.Empty(t, d.Waits)
	require.Contains(t, string(b.do(http.MethodGet, "/v1/runs/wt-1", nil, "").body), `"waits":[]`)
}

// describe reads GET /v1/runs/{id}.
func (b *bundle) describe(runID string) jetflow.RunDescription {
	b.t.Helper()
	r := b.do(http.MethodGet, "/v1/runs/"+runID, nil, "")
	require.Equal(b.t, http.StatusOK, r.code, "body: %s", r.body)
	var d jetflow.RunDescription
	r.json(b.t, &d)
	return d
}

// waitOpen reads the run until it has an open wait.
func (b *bundle) waitOpen(runID string) jetflow.RunDescription {
	b.t.Helper()
	var d jetflow.RunDescription
	require.Eventually(b.t, func() bool {
		d = b.describe(runID)
		return len(d.Waits) > 0
	}, 20*time.Second, 20*time.Millisecond, "run %s never waited", runID)
	return d
}

// names are the steps' names, in order.
func names(steps []jetflow.StepRecord) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Name
	}
	return out
}

// GET /v1/runs/{id} answers a read the server's NATS user may not make
// with 403 (retrying does not help), unavailability with 503, a missing
// run with 404.
func TestGetRunErrorStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		code int
	}{
		{jetflow.ErrRunNotFound, 404},
		{fmt.Errorf("%w: the NATS server refused a publish to $JS.API.DIRECT.GET.KV_jetflow_steps", jetflow.ErrPermissionDenied), 403},
		{fmt.Errorf("%w: disconnected", jetflow.ErrUnavailable), 503},
	} {
		s, err := New(Config{Backend: &fakeBackend{err: tc.err}})
		require.NoError(t, err)
		rec := serveChecked(t, s, httptest.NewRequest(http.MethodGet, "/v1/runs/r-1", nil), checkAll)
		require.Equal(t, tc.code, rec.Code, "%v: %s", tc.err, rec.Body)
	}
}
