package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// producer rerun on the command line: --dry-run prints the plan and
// starts nothing; a rerun from a step creates the rerun, and a repeat
// finds it; --output json is the RerunResult; a running run is exit 4, an
// unknown one exit 3, a step never reached exit 1.
func TestRerunCommand(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("start", "greet", `{"name":"ada"}`, "--id", "g-1")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("wait", "g-1")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("rerun", "g-1", "--from", "say-hello", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "rerun of g-1 from g-1.say-hello.0 as g-1-rerun-say-hello-0\n"+
		"  runs again g-1.say-hello.0 (as a new step ID: a new Idempotency-Key)\n"+
		"dry run: nothing started\n", out)
	code, _, _ = producer("get", "g-1-rerun-say-hello-0")
	require.Equal(t, exitNotFound, code, "a dry run started the rerun")

	code, out, errOut = producer("rerun", "g-1", "--from", "say-hello")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "\ncreated run g-1-rerun-say-hello-0\n")
	code, out, errOut = producer("rerun", "g-1", "--from", "say-hello", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var res jetflow.RerunResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, jetflow.OutcomeExisting, res.Start.Outcome)
	require.Equal(t, "g-1", res.SourceRunID)
	code, out, errOut = producer("wait", "g-1-rerun-say-hello-0", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var run jetflow.Run
	require.NoError(t, json.Unmarshal([]byte(out), &run), out)
	require.Equal(t, &jetflow.RerunOf{RunID: "g-1", From: "g-1.say-hello.0"}, run.RerunOf)

	code, _, errOut = producer("rerun", "g-1", "--id", "g-2-again", "--from", "no-such-step")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "never reached")
	code, _, _ = producer("rerun", "nobody-here")
	require.Equal(t, exitNotFound, code)
	code, _, errOut = producer("start", "hold", `{"name":"bo"}`, "--id", "h-1")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("rerun", "h-1")
	require.Equal(t, exitConflict, code, errOut)
	require.Contains(t, errOut, "has not ended")
}
