package state

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTaskKeyNameLayout(t *testing.T) {
	t.Parallel()
	h := TaskKeyHash("welcome/ada@example.com")
	require.Len(t, h, 32)
	require.Equal(t, h, TaskKeyHash("welcome/ada@example.com"), "stable")
	require.NotEqual(t, h, TaskKeyHash("welcome/bob@example.com"))

	for _, tc := range []struct {
		scope   KeyScope
		scopeID string
		want    string
	}{
		{ScopeRun, "order-42", "r.order-42." + h + ".send-email"},
		{ScopeWorkflow, "orders", "w.orders." + h + ".send-email"},
		{ScopeGlobal, "", "g." + h + ".send-email"},
	} {
		got, err := TaskKeyName(tc.scope, tc.scopeID, "send-email", "welcome/ada@example.com")
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
		filter, err := TaskKeyFilter(tc.scope, tc.scopeID, "welcome/ada@example.com")
		require.NoError(t, err)
		require.Equal(t, strings.TrimSuffix(tc.want, "send-email")+">", filter)
	}
	// A later generation of a run has keys of its own, which the run's
	// filter still covers.
	first, err := RunTaskKeyName("order-42", 0, "send-email", "welcome/ada@example.com")
	require.NoError(t, err)
	require.Equal(t, "r.order-42."+h+".send-email", first)
	second, err := RunTaskKeyName("order-42", 3, "send-email", "welcome/ada@example.com")
	require.NoError(t, err)
	require.Equal(t, "r.order-42."+h+".send-email.3", second)
	// Any bytes are a key: only the hash reaches the bucket.
	got, err := TaskKeyName(ScopeGlobal, "", "a", "spaces, dots. and \x00 bytes ✓")
	require.NoError(t, err)
	require.Regexp(t, `^g\.[0-9a-f]{32}\.a$`, got)
}

func TestTaskKeyValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scope          KeyScope
		scopeID, key   string
		step           string
		wantInvalidKey bool
	}{
		{ScopeRun, "run-1", "", "a", true},
		{ScopeRun, "run-1", strings.Repeat("k", MaxTaskKeyLen+1), "a", true},
		{ScopeRun, "", "k", "a", true},
		{ScopeRun, "run.1", "k", "a", true},
		{ScopeWorkflow, "wf=1", "k", "a", true},
		{ScopeGlobal, "x", "k", "a", true},
		{KeyScope(7), "", "k", "a", true},
		{ScopeRun, "run-1", "k", "a.b", true},
	} {
		_, err := TaskKeyName(tc.scope, tc.scopeID, tc.step, tc.key)
		require.ErrorIs(t, err, ErrInvalidTaskKey, "%+v", tc)
	}
	_, err := TaskKeyName(ScopeRun, "run-1", "a", strings.Repeat("k", MaxTaskKeyLen))
	require.NoError(t, err)
}

func TestTaskKeyEntryAndKeyedStepDecode(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	b, err := Encode(TaskKeyEntry{V: Version, State: TaskKeyClaimed, Owner: "r.a.0", Token: "t", LeaseMS: 2000, At: now})
	require.NoError(t, err)
	e, err := DecodeTaskKeyEntry(b)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, e.Lease())

	for _, bad := range []string{
		`{"state":"claimed","owner":"r.a.0","token":"t","lease_ms":10}`,
		`{"state":"other","owner":"r.a.0","token":"t"}`,
		`{"state":"done","token":"t"}`,
		`{"state":"done","owner":"r.a.0","token":"t","attempt":-1}`,
		`not json`,
	} {
		_, err := DecodeTaskKeyEntry([]byte(bad))
		require.ErrorIs(t, err, ErrCorrupt, bad)
	}

	// A step record with its task key reference is still a step record.
	ks := KeyedStep{
		Step:    Step{V: Version, StepID: "run-1.a.0", RunID: "run-1", Name: "a", Output: json.RawMessage(`1`), Committed: now},
		TaskKey: &StepKeyRef{Key: "g.h.a", From: "run-0.a.0", Served: true},
	}
	b, err = Encode(ks)
	require.NoError(t, err)
	require.Contains(t, string(b), `"task_key":{"key":"g.h.a","from":"run-0.a.0","served":true}`)
	s, err := DecodeStep(b)
	require.NoError(t, err)
	require.Equal(t, ks.Step, s)
	var back KeyedStep
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, ks, back)
	back, err = DecodeKeyedStep(b)
	require.NoError(t, err)
	require.Equal(t, ks, back)

	// Without a key: no reference. A reference without its key or step,
	// or a record that is not a step: corrupt.
	b, err = Encode(ks.Step)
	require.NoError(t, err)
	back, err = DecodeKeyedStep(b)
	require.NoError(t, err)
	require.Equal(t, KeyedStep{Step: ks.Step}, back)
	for _, bad := range []string{
		`{"step_id":"r.a.0","run_id":"r","name":"a","task_key":{"key":"","from":"r.a.0"}}`,
		`{"step_id":"r.a.0","run_id":"r","name":"a","task_key":{"key":"g.h.a"}}`,
		`{"step_id":"r.a.0","run_id":"r","name":"a","task_key":7}`,
		`{"step_id":"x"}`,
	} {
		_, err := DecodeKeyedStep([]byte(bad))
		require.ErrorIs(t, err, ErrCorrupt, bad)
	}
}
