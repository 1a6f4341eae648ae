package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
)

// listJSON runs list with args and --output json and decodes the page.
func listJSON(t *testing.T, producer cliFunc, args ...string) jetflow.RunPage {
	t.Helper()
	code, out, errOut := producer(append([]string{"list", "--output", "json"}, args...)...)
	require.Equal(t, 0, code, errOut)
	var page jetflow.RunPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.NotContains(t, out, `"steps"`, "list shows runs without their steps")
	return page
}

func runIDs(page jetflow.RunPage) []string {
	ids := make([]string, len(page.Runs))
	for i, r := range page.Runs {
		ids[i] = r.RunID
	}
	return ids
}

func TestList(t *testing.T) {
	t.Parallel()
	producer := setup(t)

	page := listJSON(t, producer)
	require.Empty(t, page.Runs)
	require.NotNil(t, page.Runs, "an empty page is [], not null")
	code, out, errOut := producer("list")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "no runs\n", out)

	for i := range 5 {
		id := fmt.Sprintf("g-%d", i)
		code, _, errOut := producer("start", "greet", fmt.Sprintf(`{"name":"n%d"}`, i), "--id", id)
		require.Equal(t, 0, code, errOut)
		code, _, errOut = producer("wait", id)
		require.Equal(t, 0, code, errOut)
	}
	code, _, errOut = producer("start", "hold", `{"name":"h"}`, "--id", "h-1")
	require.Equal(t, 0, code, errOut)

	// The run index is written after each record, so a listing right after
	// wait can miss the last change: wait until one page shows them all.
	require.Eventually(t, func() bool {
		return slices.Equal([]string{"h-1", "g-4", "g-3", "g-2", "g-1", "g-0"}, runIDs(listJSON(t, producer)))
	}, 10*time.Second, 10*time.Millisecond)

	// Paging through greet, two at a time, flags before the command too:
	// newest first (each run ended after the one before), each once.
	var all []string
	cursor := ""
	for pages := 1; ; pages++ {
		args := []string{"--workflow", "greet", "--limit", "2"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		page := listJSON(t, producer, args...)
		require.LessOrEqual(t, len(page.Runs), 2)
		for _, r := range page.Runs {
			require.Equal(t, "greet", r.Workflow)
			require.Equal(t, jetflow.StatusCompleted, r.Status)
		}
		all = append(all, runIDs(page)...)
		if page.Next == "" {
			require.GreaterOrEqual(t, pages, 3)
			break
		}
		require.Less(t, pages, 10)
		cursor = page.Next
	}
	require.Equal(t, []string{"g-4", "g-3", "g-2", "g-1", "g-0"}, all)

	page = listJSON(t, producer, "--status", "running")
	require.Equal(t, []string{"h-1"}, runIDs(page))
	require.Equal(t, "hold", page.Runs[0].Workflow)
	require.JSONEq(t, `{"name":"h"}`, string(page.Runs[0].Input))

	page = listJSON(t, producer, "--status", "completed", "--workflow", "hold")
	require.Empty(t, page.Runs)
	require.Equal(t, []string{"g-2"}, runIDs(listJSON(t, producer, "--prefix", "g-2")))
	require.Empty(t, listJSON(t, producer, "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)).Runs)
	require.Len(t, listJSON(t, producer, "--until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)).Runs, 6)

	code, out, errOut = producer("--limit", "2", "list")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^RUN ID\s+WORKFLOW\s+STATUS\s+UPDATED\s+CREATED\s+DUPLICATES$`, lines[0])
	require.Regexp(t, `^h-1\s+hold\s+running\s+\S+\s+\S+\s+0$`, lines[1], "the newest status change first")
	require.Regexp(t, `^g-4\s+greet\s+completed`, lines[2])
	require.Regexp(t, `^next cursor: (\S+) \(list --cursor (\S+) for the next page\)$`, lines[3])

	code, out, errOut = producer("list", "--counts")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "running    1\nblocked    0\ncompleted  5\nfailed     0\ncancelled  0\n", out)
	code, out, errOut = producer("list", "--counts", "--workflow", "hold", "--output", "json")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"running":1,"blocked":0,"completed":0,"failed":0,"cancelled":0}`, out)
}

func TestReset(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)

	startAndWait := func(id string) {
		t.Helper()
		code, _, errOut := producer("start", "lookup", `{"name":"ada"}`, "--id", id)
		require.Equal(t, 0, code, errOut)
		code, _, errOut = producer("wait", id)
		require.Equal(t, 0, code, errOut)
	}
	startAndWait("l-1")
	startAndWait("l-2")
	require.Equal(t, int64(1), tb.lookups.Load(), "the second run is served from the key's cache")

	// A scope the key is not in deletes nothing.
	code, out, errOut := producer("reset", lookupKey("ada"), "--scope", "run", "--run-id", "l-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "deleted 0 entries of key \"user/ada\" (run scope l-1)\n", out)

	code, out, errOut = producer("reset", lookupKey("ada"), "--scope", "workflow", "--workflow", "lookup", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var reset httpapi.KeyReset
	require.NoError(t, json.Unmarshal([]byte(out), &reset))
	require.Equal(t, httpapi.KeyReset{Key: "user/ada", Scope: "workflow", Workflow: "lookup", Deleted: 1}, reset)

	code, out, errOut = producer("--scope", "workflow", "reset", "--workflow", "lookup", lookupKey("ada"))
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "deleted 0 entries of key \"user/ada\" (workflow scope lookup)\n", out, "a repeat deletes nothing")

	startAndWait("l-3")
	require.Equal(t, int64(2), tb.lookups.Load(), "after the reset the step runs again")

	code, out, errOut = producer("reset", "nothing-here", "--scope", "global")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "deleted 0 entries of key \"nothing-here\" (global scope)\n", out)
}

func TestConflictExitCode(t *testing.T) {
	t.Parallel()
	producer := setup(t)

	code, _, errOut := producer("start", "greet", `{"name":"ada"}`, "--id", "c-1")
	require.Equal(t, 0, code, errOut)
	code, out, errOut := producer("start", "greet", `{"name":"bob"}`, "--id", "c-1")
	require.Equal(t, 4, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "idempotency conflict")
	code, _, errOut = producer("start", "hold", `{"name":"ada"}`, "--id", "c-1")
	require.Equal(t, 4, code, "another workflow under the same ID: %s", errOut)

	// A duplicate the workflow's policy rejects while the run is running.
	code, _, errOut = producer("start", "exclusive", `{"name":"eve"}`, "--id", "x-1")
	require.Equal(t, 0, code, errOut)
	code, out, errOut = producer("start", "exclusive", `{"name":"eve"}`, "--id", "x-1")
	require.Equal(t, 4, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "x-1")

	code, out, errOut = producer("get", "c-1", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var run jetflow.RunDescription
	require.NoError(t, json.Unmarshal([]byte(out), &run))
	require.JSONEq(t, `{"name":"ada"}`, string(run.Input), "the run keeps its input")
	require.Equal(t, int64(2), run.Duplicates)
	require.Equal(t, "conflict", run.RecentDuplicates[0].Outcome)
	require.False(t, run.RecentDuplicates[0].FingerprintMatch)
}

// TestIDNotFromEnvironment: --id and --generate-id are read from the
// command line only, so a stray JETFLOW_ID does not make every start land
// on one run, and a JETFLOW_GENERATE_ID does not turn a start without --id
// into a new run.
func TestIDNotFromEnvironment(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, map[string]string{
		"JETFLOW_ID": "fixed", "JETFLOW_TIMEOUT": "1ns", "JETFLOW_SCOPE": "bogus", "JETFLOW_LIMIT": "1",
		// A setting of serve in the environment does not bother the other commands.
		"JETFLOW_HTTP_ADDR": "127.0.0.1:1234", "JETFLOW_GENERATE_ID": "true",
	})
	code, _, errOut := producer("start", "greet", `{"name":"ada"}`)
	require.Equal(t, 1, code, "JETFLOW_GENERATE_ID is not read")
	require.Contains(t, errOut, "start needs --id RUNID")
	ids := map[string]bool{}
	for range 2 {
		code, out, errOut := producer("start", "greet", `{"name":"ada"}`, "--generate-id", "--output", "json")
		require.Equal(t, 0, code, errOut)
		var res jetflow.StartResult
		require.NoError(t, json.Unmarshal([]byte(out), &res))
		require.Equal(t, jetflow.OutcomeCreated, res.Outcome)
		require.NotEqual(t, "fixed", res.RunID)
		ids[res.RunID] = true
	}
	require.Len(t, ids, 2)
	for id := range ids {
		code, _, errOut := producer("wait", id) // JETFLOW_TIMEOUT=1ns is not read either
		require.Equal(t, 0, code, errOut)
	}
	code, _, errOut = producer("reset", "k", "--scope", "global")
	require.Equal(t, 0, code, errOut)
	require.Len(t, listJSON(t, producer).Runs, 2, "JETFLOW_LIMIT is not read")
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"ListArity", []string{"list", "x"}, "error: list takes no arguments"},
		{"ResetArity", []string{"reset", "--scope", "global"}, "error: reset takes one key"},
		{"ServeArity", []string{"serve", "now"}, "error: serve takes no arguments"},
		{"ResetNoScope", []string{"reset", "k"}, "error: reset needs --scope global, workflow or run"},
		{"ResetBadScope", []string{"reset", "k", "--scope", "team"}, `error: invalid value "team" for --scope`},
		{"ResetWorkflowScopeNoWorkflow", []string{"reset", "k", "--scope", "workflow"}, "error: --scope workflow needs --workflow W"},
		{"ResetRunScopeWithWorkflow", []string{"reset", "k", "--scope", "run", "--run-id", "r", "--workflow", "w"}, "error: --scope run needs --run-id R and no --workflow"},
		{"ResetGlobalWithRunID", []string{"reset", "k", "--scope", "global", "--run-id", "r"}, "error: --scope global takes neither"},
		{"ResetInvalidRunID", []string{"reset", "k", "--scope", "run", "--run-id", "a.b"}, "error: reset key: "},
		{"ListBadStatus", []string{"list", "--status", "done"}, `error: invalid value "done" for --status`},
		{"ListBadLimit", []string{"list", "--limit", "501"}, "error: invalid value 501 for --limit: want 1..500"},
		{"ListZeroLimit", []string{"list", "--limit", "0"}, "error: invalid value 0 for --limit: want 1..500"},
		{"ListNegativeLimit", []string{"list", "--limit=-1"}, "error: invalid value -1 for --limit: want 1..500"},
		{"ListBadCursor", []string{"list", "--cursor", "a b"}, "error: jetflow: invalid list options"},
		{"ListBadSince", []string{"list", "--since", "yesterday"}, `error: invalid value "yesterday" for --since: want an RFC 3339 time`},
		{"ListBadUntil", []string{"list", "--until", "2026-01-02"}, `error: invalid value "2026-01-02" for --until`},
		{"ListEmptyWindow", []string{"list", "--since", "2026-01-02T00:00:00Z", "--until", "2026-01-01T00:00:00Z"}, "error: --since 2026-01-02T00:00:00Z is not before --until"},
		{"ListBadPrefix", []string{"list", "--prefix", "a.b"}, "error: jetflow: invalid list options"},
		{"CountsWithStatus", []string{"list", "--counts", "--status", "running"}, "error: --counts takes no --status (only --workflow)"},
		{"WatchArity", []string{"watch"}, "error: watch takes one run ID"},
		{"WatchBadInterval", []string{"watch", "r", "--interval", "0s"}, "error: invalid value 0s for --interval: must be positive"},
		{"IntervalOnGet", []string{"get", "r", "--interval", "1s"}, "error: --interval is a flag of watch, not get"},
		{"StatusOnGet", []string{"get", "r", "--status", "running"}, "error: --status is a flag of list, not get"},
		{"WorkflowOnStart", []string{"start", "greet", "{}", "--workflow", "w"}, "error: --workflow is a flag of list and reset, not start"},
		{"HTTPAddrOnList", []string{"list", "--http-addr", "127.0.0.1:0"}, "error: --http-addr is a flag of serve, not list"},
		{"BadReplicas", []string{"list", "--replicas", "2"}, "error: invalid value 2 for --replicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := producer(tc.args...)
			require.Equal(t, 1, code, errOut)
			require.Empty(t, out)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}

// cancel cancels a running run (exit 0) and says so; a repeat exits 0 too
// and says it was already cancelled; the run then ends cancelled. A run
// that completed is refused with exit 1 and its state, and stays
// completed.
func TestCancel(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, _, errOut := producer("start", "hold", `{"name":"kim"}`, "--id", "k-1")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("cancel", "k-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "cancelled k-1\n", out)
	require.Empty(t, errOut)

	code, out, errOut = producer("cancel", "k-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "k-1 was already cancelled\n", out)

	code, out, errOut = producer("--output", "json", "cancel", "k-1")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"run_id":"k-1","status":"cancelled","already_cancelled":true,"children":[]}`, out)

	code, out, errOut = producer("wait", "k-1")
	require.Equal(t, exitRunFailed, code, errOut)
	require.Equal(t, "run k-1 cancelled\n", out)
	code, out, errOut = producer("get", "k-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status:      cancelled\n")

	code, _, errOut = producer("start", "greet", `{"name":"ada"}`, "--id", "k-2")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("wait", "k-2")
	require.Equal(t, 0, code, errOut)
	code, out, errOut = producer("cancel", "k-2")
	require.Equal(t, exitError, code, errOut)
	require.Empty(t, out)
	require.Equal(t, "error: cannot cancel: jetflow: run already ended: k-2 is completed\n", errOut)
	code, out, errOut = producer("get", "k-2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status:      completed\n", "the refused cancel changed nothing")
}

// The text output lists the child runs cancelled with the run, one a line;
// JSON is the HTTP API's body.
func TestCancelOutput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c          httpapi.Cancelled
		text, json string
	}{
		{httpapi.NewCancelled(jetflow.CancelOutcome{RunID: "p-1", Status: jetflow.StatusCancelled, Children: []string{"p-1-a", "p-1-a-b"}}),
			"cancelled p-1\ncancelled child run p-1-a\ncancelled child run p-1-a-b\n",
			`{"run_id":"p-1","status":"cancelled","already_cancelled":false,"children":["p-1-a","p-1-a-b"]}`},
		{httpapi.NewCancelled(jetflow.CancelOutcome{RunID: "p-2", Status: jetflow.StatusCancelled, AlreadyCancelled: true}),
			"p-2 was already cancelled\n",
			`{"run_id":"p-2","status":"cancelled","already_cancelled":true,"children":[]}`},
	} {
		var text, js strings.Builder
		require.NoError(t, (&printer{w: &text}).cancelled(tc.c))
		require.Equal(t, tc.text, text.String())
		require.NoError(t, (&printer{w: &js, json: true}).cancelled(tc.c))
		require.JSONEq(t, tc.json, js.String())
	}
}
