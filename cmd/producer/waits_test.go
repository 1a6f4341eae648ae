package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// get on a waiting run says what it waits for, since when and that it has
// no deadline; after the event, the event's line comes where the wait
// stood, and the next wait after it.
func TestGetShowsOpenWaits(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, _, errOut := producer("start", "inbox", `""`, "--id", "in-w")
	require.Equal(t, 0, code, errOut)

	waiting := getUntil(t, producer, "in-w", "waiting for event paid")
	require.Regexp(t, `(?m)^  \+\S+\s+-\s+event=paid\s+in-w\.event=paid\.0\s+-\s+-\s+-\s+waiting for event paid, no deadline; send it: producer send in-w paid --event-id ID --data JSON$`, waiting)

	code, _, errOut = producer("send", "in-w", "paid", "--event-id", "e-1", "--data", `{"ref":"r1"}`)
	require.Equal(t, 0, code, errOut)
	out := getUntil(t, producer, "in-w", "waiting for event done")
	_, steps, _ := strings.Cut(out, "steps:\n")
	lines := strings.Split(strings.TrimSuffix(steps, "\n"), "\n")
	require.Len(t, lines, 3, steps)
	require.Regexp(t, `^  \+\S+\s+\S+\s+event=paid\s+in-w\.event=paid\.0\s+1\s+.*event e-1$`, lines[1])
	require.Regexp(t, `^  \+\S+\s+-\s+event=done\s+in-w\.event=done\.0\s+.*waiting for event done, no deadline; send it: producer send in-w done --event-id ID --data JSON$`, lines[2])
}

// getUntil runs get until its output contains want, and returns it.
func getUntil(t *testing.T, producer cliFunc, runID, want string) string {
	t.Helper()
	var out string
	require.Eventually(t, func() bool {
		code, o, errOut := producer("get", runID)
		require.Equal(t, 0, code, errOut)
		out = o
		return strings.Contains(out, want)
	}, 20*time.Second, 20*time.Millisecond, "get %s never said %q", runID, want)
	return out
}
