package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// producer workers lists the testbed's one worker and the workflows it
// serves, as text and as GET /v1/workers's JSON.
func TestWorkers(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	served := []string{"exclusive", "flaky", "greet", "hold", "inbox", "lookup", "signup"}

	code, out, errOut := producer("workers", "--output", "json")
	require.Equal(t, exitOK, code, errOut)
	var r jetflow.Roster
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Len(t, r.Workers, 1)
	w := r.Workers[0]
	require.Equal(t, served, w.Workflows)
	require.NotEmpty(t, w.ID)
	var names []string
	for _, wf := range r.Workflows {
		names = append(names, wf.Workflow)
		require.Equal(t, []string{w.Name}, wf.Workers, wf.Workflow)
	}
	require.Equal(t, served, names)

	code, out, errOut = producer("workers")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4+len(served), out)
	require.Regexp(t, `^WORKER\s+ID\s+WORKFLOWS\s+BUILD\s+SINCE\s+LAST BEAT$`, lines[0])
	build := w.Build
	if build == "" {
		build = "-"
	}
	require.Regexp(t, `^`+w.Name+`\s+`+w.ID+`\s+`+strings.Join(served, ",")+`\s+`+regexp.QuoteMeta(build)+`\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d+s ago$`, lines[1])
	require.Regexp(t, `^WORKFLOW\s+SERVED BY$`, lines[3])
	require.Regexp(t, `^exclusive\s+`+w.Name+`$`, lines[4])

	code, _, errOut = producer("workers", "extra")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "workers takes no arguments")
}

// The text form says when no worker runs, and which known workflow has
// no worker (its starts wait); times are UTC, the last heartbeat an age.
func TestWorkersText(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 27, 12, 0, 10, 0, time.UTC)
	var b bytes.Buffer
	p := &printer{w: &b}
	require.NoError(t, p.roster(jetflow.Roster{Workflows: []jetflow.KnownWorkflow{{Workflow: "order"}}}, now))
	require.Equal(t, "WORKER  ID  WORKFLOWS  BUILD  SINCE  LAST BEAT\n(no worker running)\n\nWORKFLOW  SERVED BY\norder  no worker running\n",
		collapse(b.String()))

	b.Reset()
	since := time.Date(2026, 11, 27, 13, 0, 0, 0, time.FixedZone("CET", 3600))
	require.NoError(t, p.roster(jetflow.Roster{
		Workers: []jetflow.LiveWorker{{ID: "w1", Name: "a\x1b[31m", Workflows: []string{"order", "refund"}, Since: since, Beat: now.Add(-3 * time.Second),
			Protocol: jetflow.EngineProtocol, Build: "abc123"}, {ID: "w2", Name: "old", Workflows: []string{"order"}, Since: since, Beat: now}},
		Workflows: []jetflow.KnownWorkflow{{Workflow: "order", Workers: []string{"a"}}, {Workflow: "refund", Workers: []string{"a"}}},
	}, now))
	require.Contains(t, collapse(b.String()), `a\x1b[31m  w1  order,refund  abc123  2026-11-27 12:00:00  3s ago`)
	require.Contains(t, collapse(b.String()), `old  w2  order  - (engine protocol 0)  2026-11-27 12:00:00  0s ago`, "a worker of an earlier engine says so")
}

// collapse makes each run of spaces one (tabwriter's padding).
func collapse(s string) string {
	for strings.Contains(s, "   ") {
		s = strings.ReplaceAll(s, "   ", "  ")
	}
	return s
}
