package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
)

// A blocked run on the command line: list --status blocked lists it, the
// counts count it, get shows its block (kind, place, the history's and the
// code's step, detail, build, since) and --output json carries it. unblock
// replays it with the workers' code, which blocks it again;
// --accept-divergence says which step of the history it waived and which
// step of the code runs again, and the run completes with that step run
// once more. A run not blocked is exit 1, an unknown one exit 3.
func TestUnblock(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	const id = "s-1"
	blocked := tb.block(t, id)
	first, renamed := blocktest.StepID(id, blocktest.First), blocktest.StepID(id, blocktest.Renamed)

	require.Eventually(t, func() bool {
		return slices.Equal([]string{id}, runIDs(listJSON(t, producer, "--status", "blocked")))
	}, 10*time.Second, 10*time.Millisecond, "the run index lists the blocked run")
	code, out, errOut := producer("list", "--status", "blocked")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `\ns-1\s+signup\s+blocked\s`, out)
	code, out, errOut = producer("list", "--counts", "--workflow", blocktest.Workflow)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "running    0\nblocked    1\ncompleted  0\nfailed     0\ncancelled  0\n", out)

	code, out, errOut = producer("get", id)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status:      blocked\n")
	require.Contains(t, out, "\nblocked: divergence: no step runs until code that replays its history takes it, or producer unblock s-1\n")
	for _, line := range []string{
		"kind:          renamed",
		"place:         0",
		"history step:  step send-welcome (s-1.send-welcome.0)",
		"code step:     step send-welcome-email (s-1.send-welcome-email.0)",
		"detail:        " + blocked.Block.Divergence.Detail,
		"build:         " + blocktest.Build,
		"since:         " + blocked.Block.Since.UTC().Format(time.RFC3339Nano),
	} {
		require.Contains(t, out, "\n  "+line+"\n")
	}
	code, out, errOut = producer("get", id, "--output", "json")
	require.Equal(t, 0, code, errOut)
	var d jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(out), &d), out)
	require.Equal(t, blocked.Block, d.Block)

	code, out, errOut = producer("unblock", id)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "unblocked s-1: running, replayed with the workers' code (blocked again if it still diverges)\n", out)
	require.Empty(t, errOut)
	require.Eventually(t, func() bool {
		code, out, _ := producer("get", id, "--output", "json")
		var d jetflow.RunDescription
		return code == 0 && json.Unmarshal([]byte(out), &d) == nil && d.Status == jetflow.StatusBlocked && d.Block.Since.After(blocked.Block.Since)
	}, 30*time.Second, 10*time.Millisecond, "the unblocked run was not replayed")
	require.Zero(t, tb.signup.Effects(renamed))

	code, out, errOut = producer("unblock", id, "--accept-divergence")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "unblocked s-1: running, without step s-1.send-welcome.0 of its history (waived)\n"+
		"runs again: step send-welcome-email (s-1.send-welcome-email.0), the code's step at place 0: its side effects repeat\n", out)
	code, _, errOut = producer("wait", id)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 1, tb.signup.Effects(first))
	require.Equal(t, 1, tb.signup.Effects(renamed), "the accepted step ran")
	code, out, errOut = producer("get", id)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "waived:      s-1.send-welcome.0\n")
	require.NotContains(t, out, "blocked:")

	code, out, errOut = producer("unblock", id)
	require.Equal(t, exitError, code, errOut)
	require.Empty(t, out)
	require.Equal(t, "error: cannot unblock: jetflow: run is not blocked: s-1 is completed\n", errOut)
}

// After a rollback (the run's first code back), unblock lets the run go
// on; --output json prints the HTTP API's body.
func TestUnblockJSON(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	tb.block(t, "s-2")
	tb.signup.Restore("s-2")
	code, out, errOut := producer("--output", "json", "unblock", "s-2")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"run_id":"s-2","status":"running"}`, out)
	code, out, errOut = producer("wait", "s-2")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, `run s-2 completed: "sent"`+"\n", out)
	require.Zero(t, tb.signup.Effects(blocktest.StepID("s-2", blocktest.Renamed)))
}

// What unblock prints for each block it lifted: the waived step, and the
// code's step that runs again in its place, or that none does; JSON is the
// HTTP API's body.
func TestUnblockOutput(t *testing.T) {
	t.Parallel()
	hist := &jetflow.DivergedStep{StepID: "p-1.a.0", Name: "a", Kind: "step"}
	code := &jetflow.DivergedStep{StepID: "p-1.b.0", Name: "b", Kind: "step"}
	accepted := httpapi.NewUnblocked(jetflow.UnblockOutcome{RunID: "p-1", Status: jetflow.StatusRunning, Waived: "p-1.a.0"})
	waived := "unblocked p-1: running, without step p-1.a.0 of its history (waived)\n"
	for _, tc := range []struct {
		u          httpapi.Unblocked
		div        *jetflow.Divergence
		text, json string
	}{
		{httpapi.NewUnblocked(jetflow.UnblockOutcome{RunID: "p-1", Status: jetflow.StatusRunning}), nil,
			"unblocked p-1: running, replayed with the workers' code (blocked again if it still diverges)\n", `{"run_id":"p-1","status":"running"}`},
		{accepted, &jetflow.Divergence{Kind: "renamed", Position: 2, History: hist, Code: code},
			waived + "runs again: step b (p-1.b.0), the code's step at place 2: its side effects repeat\n", `{"run_id":"p-1","status":"running","waived":"p-1.a.0"}`},
		{accepted, &jetflow.Divergence{Kind: "removed", Position: 2, History: hist},
			waived + "the code starts no step at place 2: the run goes on without the waived step\n", ""},
		{accepted, nil, waived + "runs again: the code's step at the waived step's place: its side effects repeat\n", ""},
	} {
		var text, js strings.Builder
		require.NoError(t, (&printer{w: &text}).unblocked(tc.u, tc.div))
		require.Equal(t, tc.text, text.String())
		if tc.json != "" {
			require.NoError(t, (&printer{w: &js, json: true}).unblocked(tc.u, tc.div))
			require.JSONEq(t, tc.json, js.String())
		}
	}
}
