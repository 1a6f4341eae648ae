package view

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

var at = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func TestRunJSON(t *testing.T) {
	t.Parallel()
	run := jetflow.Run{
		RunID: "order-1", Workflow: "ship", Status: jetflow.StatusFailed, Input: json.RawMessage(`{"a":"<b>"}`),
		Error: &jetflow.RunError{Kind: "step", Message: "down"}, Source: "http", CreatedAt: at, UpdatedAt: at,
		Generation: 1, Duplicates: 2,
		FirstDuplicate:   &jetflow.DuplicateAttempt{At: at, Source: "cli", Outcome: "existing", FingerprintMatch: true, Status: jetflow.StatusRunning},
		RecentDuplicates: []jetflow.DuplicateAttempt{{At: at, Outcome: "conflict"}},
	}
	b, err := json.Marshal(NewRun(run))
	require.NoError(t, err)
	require.JSONEq(t, `{
		"run_id":"order-1","workflow":"ship","status":"failed","source":"http",
		"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z","generation":1,"duplicates":2,
		"first_duplicate":{"at":"2025-01-02T03:04:05Z","source":"cli","outcome":"existing","fingerprint_match":true,"status":"running"},
		"recent_duplicates":[{"at":"2025-01-02T03:04:05Z","outcome":"conflict","fingerprint_match":false}],
		"input":{"a":"<b>"},"error":{"kind":"step","message":"down"}}`, string(b))
	require.NotContains(t, string(b), `"steps"`, "no steps unless asked for")

	b, err = json.Marshal(NewRunWithSteps(run, nil))
	require.NoError(t, err)
	require.Contains(t, string(b), `"steps":[]`, "asked for and none: an empty list")

	b, err = json.Marshal(NewRunWithSteps(run, []jetflow.StepRecord{{
		StepID: "order-1.pack.0", Name: "pack", Attempt: 2, Output: json.RawMessage(`3`), Worker: "w1", CommittedAt: at,
	}}))
	require.NoError(t, err)
	var back Run
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, []Step{{StepID: "order-1.pack.0", Name: "pack", Attempt: 2, Output: json.RawMessage(`3`), Worker: "w1", CommittedAt: at}}, back.Steps)
}

func TestStartResultAndPageJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(NewStartResult(jetflow.StartResult{RunID: "r", Workflow: "w", Outcome: jetflow.OutcomeExisting, Status: jetflow.StatusRunning, Duplicates: 4}))
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"r","workflow":"w","outcome":"existing","status":"running","duplicates":4}`, string(b))

	b, err = json.Marshal(NewRunPage(jetflow.RunPage{}))
	require.NoError(t, err)
	require.JSONEq(t, `{"runs":[]}`, string(b))

	b, err = json.Marshal(NewRunPage(jetflow.RunPage{Runs: []jetflow.Run{{RunID: "a", Workflow: "w", Status: jetflow.StatusRunning}}, Next: "a"}))
	require.NoError(t, err)
	var page RunPage
	require.NoError(t, json.Unmarshal(b, &page))
	require.Equal(t, "a", page.NextCursor)
	require.Len(t, page.Runs, 1)
}
