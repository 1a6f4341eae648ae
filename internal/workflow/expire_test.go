package workflow

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Expire removes an ended run generation's records — steps and lease,
// attempt and wait records, the hook token its wait recorded — and
// nothing else: not a later generation's records, not a token that a later
// generation of the run ID took over, not the records of a run whose
// identity is live again (a first generation started anew under the run
// ID, with another token). A run whose token is not known (its record had
// expired when its end was read) loses its records and token too. A
// repeat removes nothing more. Due as an
// expiry timer, the same is done by the worker that takes the timer.
func TestExpireRemovesOnlyTheEndedGenerationsRecords(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	put := func(kv *jetstream.KV, key string, v any) {
		t.Helper()
		b, err := state.Encode(v)
		require.NoError(t, err)
		_, err = kv.Create(r.ctx(), key, b)
		require.NoError(t, err)
	}
	now := time.Now().UTC()
	run := func(id string, gen int, token string, status state.Status) {
		put(r.a.Runs, id, state.Run{V: state.Version, RunID: id, Workflow: wf, Status: status, Token: token,
			Generation: gen, CreatedAt: now, UpdatedAt: now, Exec: state.ExecLease})
	}
	hookWait := func(stepID, runID string, gen int, runToken, token string, owner bool) {
		put(r.a.Attempts, state.WaitKey(stepID), state.Wait{V: state.Version, StepID: stepID, Kind: state.StepHook,
			Event: "ok", Token: token, Since: now})
		if owner {
			put(r.a.Hooks, token, state.Hook{V: state.Version, Token: token, RunID: runID, Workflow: wf,
				RunToken: runToken, Generation: gen, StepID: stepID, Event: "ok", CreatedAt: now})
		}
	}
	// Run ID "r": generation 0 ended and was replaced by generation 5,
	// running, which took over the token tok-b.
	run("r", 5, "t5", state.StatusRunning)
	for _, k := range []string{"r.a.0", "r.lease", "r/5.a.0", "rx.a.0"} {
		put(r.a.Steps, k, map[string]string{"k": k})
	}
	put(r.a.Attempts, "r.a.0", state.AttemptLog{V: state.Version, Started: 2})
	hookWait("r.hook=ok.0", "r", 0, "t0", "tok-a", true)
	hookWait("r.hook=ok.1", "r", 0, "t0", "tok-b", false)
	hookWait("r/5.hook=ok.0", "r", 5, "t5", "tok-b", true)
	// Run ID "x": started anew as a first generation, by another token.
	run("x", 0, "t-new", state.StatusRunning)
	put(r.a.Steps, "x.a.0", map[string]string{"k": "x"})
	// Run ID "m": its record expired before its end was read (the token
	// is not known), its records outlived it.
	put(r.a.Steps, "m.a.0", map[string]string{"k": "m"})
	hookWait("m.hook=ok.0", "m", 0, "t-m", "tok-m", true)

	keys := func(kv *jetstream.KV) []string {
		t.Helper()
		entries, err := kv.Matching(r.ctx(), ">")
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Key)
		}
		slices.Sort(out)
		return out
	}
	ended := []state.EndedRun{{RunID: "r", Token: "t0"}, {RunID: "x", Token: "t-old"}, {RunID: "m"}}
	for range 2 {
		require.NoError(t, Expire(r.ctx(), r.a, ended))
		require.Equal(t, []string{"r/5.a.0", "rx.a.0", "x.a.0"}, keys(r.a.Steps))
		require.Equal(t, []string{"r/5.hook=ok.0.wait"}, keys(r.a.Attempts))
		require.Equal(t, []string{"tok-b"}, keys(r.a.Hooks))
	}

	// The same, due as a timer: generation 5 ended too.
	b, err := state.Encode(state.Run{V: state.Version, RunID: "r", Workflow: wf, Status: state.StatusCompleted,
		Token: "t5", Generation: 5, CreatedAt: now, UpdatedAt: now, Exec: state.ExecLease})
	require.NoError(t, err)
	_, err = r.a.Runs.Put(r.ctx(), "r", b)
	require.NoError(t, err)
	b, err = state.Encode(state.Expiry{V: state.Version, Due: now, Runs: []state.EndedRun{{RunID: "r", Generation: 5, Token: "t5"}}})
	require.NoError(t, err)
	require.NoError(t, jetstream.ScheduleExpiry(r.ctx(), r.a.JS, "e1", b, now))
	r.serveExpiries()
	require.Eventually(t, func() bool {
		return slices.Equal(keys(r.a.Steps), []string{"rx.a.0", "x.a.0"}) && len(keys(r.a.Attempts)) == 0 && len(keys(r.a.Hooks)) == 0
	}, r.within(), 20*time.Millisecond)
}
