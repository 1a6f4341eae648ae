package jetflow

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The JSON encodings of the public records are what the HTTP API and the
// producer's --output json show (docs/http.md, internal/server/httpapi/openapi.yaml):
// snake_case names in a fixed order, optional fields omitted when empty.
// These tests were internal/view's, which copied these records into
// look-alike structs before the records carried their own tags.

var jsonAt = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// encodeJSON encodes v as the HTTP API does: no HTML escaping, one line.
func encodeJSON(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return b.String()
}

func TestRunJSON(t *testing.T) {
	t.Parallel()
	run := Run{
		RunID: "order-1", Workflow: "ship", Status: StatusFailed, Input: json.RawMessage(`{"a":"<b>"}`),
		Error: &RunError{RunID: "order-1", Status: StatusFailed, Kind: "step", Message: "down"}, Source: "http",
		CreatedAt: jsonAt, UpdatedAt: jsonAt, Generation: 1, Duplicates: 2,
		FirstDuplicate:   &DuplicateAttempt{At: jsonAt, Source: "cli", Outcome: "existing", FingerprintMatch: true, Status: StatusRunning},
		RecentDuplicates: []DuplicateAttempt{{At: jsonAt, Outcome: "conflict"}},
	}
	// Byte for byte, field order included: the run ID and status of the
	// error are the run's own fields, not repeated in it.
	require.Equal(t, `{"run_id":"order-1","workflow":"ship","status":"failed","source":"http",`+
		`"created_at":"2025-01-02T03:04:05Z","updated_at":"2025-01-02T03:04:05Z","generation":1,"duplicates":2,`+
		`"first_duplicate":{"at":"2025-01-02T03:04:05Z","source":"cli","outcome":"existing","fingerprint_match":true,"status":"running"},`+
		`"recent_duplicates":[{"at":"2025-01-02T03:04:05Z","outcome":"conflict","fingerprint_match":false}],`+
		`"input":{"a":"<b>"},"error":{"kind":"step","message":"down"}}`+"\n", encodeJSON(t, run))
	require.NotContains(t, encodeJSON(t, run), `"steps"`, "a run has no steps of its own")

	// A running run: no error, output, source or audit.
	require.Equal(t, `{"run_id":"a","workflow":"w","status":"running","created_at":"2025-01-02T03:04:05Z",`+
		`"updated_at":"2025-01-02T03:04:05Z","generation":0,"duplicates":0,"input":null}`+"\n",
		encodeJSON(t, Run{RunID: "a", Workflow: "w", Status: StatusRunning, CreatedAt: jsonAt, UpdatedAt: jsonAt, Input: json.RawMessage(`null`)}))

	var back Run
	require.NoError(t, json.Unmarshal([]byte(encodeJSON(t, run)), &back))
	run.Error.RunID, run.Error.Status = "", ""
	require.Equal(t, run, back)
}

func TestStepRecordJSON(t *testing.T) {
	t.Parallel()
	step := StepRecord{StepID: "order-1.pack.0", Name: "pack", Seq: 3, Attempt: 2, Output: json.RawMessage(`3`), Worker: "w1", CommittedAt: jsonAt}
	require.Equal(t, `{"step_id":"order-1.pack.0","name":"pack","attempt":2,"output":3,"worker":"w1","committed_at":"2025-01-02T03:04:05Z"}`+"\n",
		encodeJSON(t, step), "seq is not encoded: a list of steps is in its order")
	var back StepRecord
	require.NoError(t, json.Unmarshal([]byte(encodeJSON(t, step)), &back))
	step.Seq = 0
	require.Equal(t, step, back)

	failed := StepRecord{StepID: "order-1.ship.1", Name: "ship", Attempt: 1, Error: "boom", Fatal: true, CommittedAt: jsonAt}
	require.Equal(t, `{"step_id":"order-1.ship.1","name":"ship","attempt":1,"error":"boom","fatal":true,"committed_at":"2025-01-02T03:04:05Z"}`+"\n",
		encodeJSON(t, failed))

	// A result served from a task key: the key and the step that produced
	// it, after the fields a step without a key has.
	served := StepRecord{StepID: "order-2.pack.0", Name: "pack", Attempt: 1, Output: json.RawMessage(`3`),
		Worker: "w2 (served from task key g.h.pack, result of order-1.pack.0)", CommittedAt: jsonAt,
		TaskKey: &StepTaskKey{Key: "g.h.pack", Served: true, From: "order-1.pack.0"}}
	require.Equal(t, `{"step_id":"order-2.pack.0","name":"pack","attempt":1,"output":3,`+
		`"worker":"w2 (served from task key g.h.pack, result of order-1.pack.0)","committed_at":"2025-01-02T03:04:05Z",`+
		`"task_key":{"key":"g.h.pack","served":true,"from":"order-1.pack.0"}}`+"\n", encodeJSON(t, served))
}

func TestStartResultJSON(t *testing.T) {
	t.Parallel()
	require.Equal(t, `{"run_id":"r","workflow":"w","outcome":"existing","status":"running","duplicates":4}`+"\n",
		encodeJSON(t, StartResult{RunID: "r", Workflow: "w", Outcome: OutcomeExisting, Status: StatusRunning, Duplicates: 4}))
	require.Equal(t, `{"run_id":"r","workflow":"w","outcome":"created","status":"running","duplicates":0,"after_expiry":true}`+"\n",
		encodeJSON(t, StartResult{RunID: "r", Workflow: "w", Outcome: OutcomeCreated, Status: StatusRunning, AfterExpiry: true}))
}

func TestRunPageJSON(t *testing.T) {
	t.Parallel()
	page := RunPage{Runs: []Run{{RunID: "a", Workflow: "w", Status: StatusRunning}}, Next: "a"}
	b := encodeJSON(t, page)
	require.Contains(t, b, `"next_cursor":"a"`)
	var back RunPage
	require.NoError(t, json.Unmarshal([]byte(b), &back))
	require.Equal(t, page, back)
	require.Equal(t, `{"runs":[]}`+"\n", encodeJSON(t, RunPage{Runs: []Run{}}), "the last page has no cursor")
}
