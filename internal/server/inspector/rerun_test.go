package inspector_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// The page's Rerun… as it asks the API, logged in with a token: the plan
// (dry_run) and then the rerun with the plan's step and run ID, with the
// cookie and X-Jetflow-UI: 1. The cookie alone is refused and starts
// nothing; the plan starts nothing; the rerun is created (201), a repeat
// finds it (200, existing); a run not ended is refused (409), which the
// page shows as the action's error.
func TestRerunAsThePageAsks(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t, testToken)
	cookie := token.CookieName + "=" + token.CookieValue(testToken)
	page := http.Header{token.HeaderUI: {"1"}, "Cookie": {cookie}, "Content-Type": {"application/json"}}
	e.Start("fails", "declined-2", map[string]any{"n": 2})
	require.Equal(t, jetflow.StatusFailed, e.Wait("declined-2").Status)
	const path = "/v1/runs/declined-2/rerun"

	res := e.Send(http.MethodPost, path, http.Header{"Cookie": {cookie}, "Content-Type": {"application/json"}}, `{}`)
	require.Equal(t, http.StatusUnauthorized, res.Code, "the cookie alone (a cross-site form): %s", res.Body)

	res = e.Send(http.MethodPost, path, page, `{"dry_run":true}`)
	require.Equal(t, http.StatusOK, res.Code, res.Body)
	var plan jetflow.RerunResult
	require.NoError(t, json.Unmarshal([]byte(res.Body), &plan))
	require.Nil(t, plan.Start, "a plan starts nothing")
	require.Equal(t, "declined-2", plan.SourceRunID)
	require.Equal(t, "declined-2-rerun", plan.RunID, "the run failed before any step: a rerun from after its last")
	require.Empty(t, plan.From)
	require.Empty(t, plan.Kept)
	require.Empty(t, plan.Again)
	_, err := e.Client.GetRun(ctxT(t, 10*time.Second), plan.RunID)
	require.ErrorIs(t, err, jetflow.ErrRunNotFound)

	// What the page posts on OK: the plan's run ID (and step, here none).
	body, err := json.Marshal(map[string]string{"run_id": plan.RunID})
	require.NoError(t, err)
	res = e.Send(http.MethodPost, path, page, string(body))
	require.Equal(t, http.StatusCreated, res.Code, res.Body)
	var done jetflow.RerunResult
	require.NoError(t, json.Unmarshal([]byte(res.Body), &done))
	require.Equal(t, jetflow.OutcomeCreated, done.Start.Outcome)
	require.Equal(t, plan.RunID, done.Start.RunID)
	res = e.Send(http.MethodPost, path, page, string(body))
	require.Equal(t, http.StatusOK, res.Code, res.Body)
	require.NoError(t, json.Unmarshal([]byte(res.Body), &done))
	require.Equal(t, jetflow.OutcomeExisting, done.Start.Outcome, "a repeat starts nothing")

	rerun := e.Wait(plan.RunID)
	require.Equal(t, &jetflow.RerunOf{RunID: "declined-2"}, rerun.RerunOf)
	src := e.RequireRun("declined-2", jetflow.StatusFailed, 0, "the source is left as it was")
	require.Len(t, src.Reruns, 1)
	require.Equal(t, plan.RunID, src.Reruns[0].RunID)

	e.Start("waiter", "waiting-2", map[string]any{"n": 2})
	res = e.Send(http.MethodPost, "/v1/runs/waiting-2/rerun", page, `{"dry_run":true}`)
	require.Equal(t, http.StatusConflict, res.Code, res.Body)
	require.Contains(t, res.Body, `"title":"Run not ended"`)
}
