package inspector_test

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// A blocked run (its code renamed the step it committed first), logged in
// with a token: the list shows it with its own badge and counts it, and
// the status filter finds it; its page shows the block report as
// Client.GetRun reads it (kind, place, the history's and the code's step,
// detail, build, since) and the actions Unblock and Accept divergence.
// Unblock replays it with the same code, which blocks it again (a later
// since) and runs nothing. Accept divergence's dialog says which step of
// the history is waived and that the code's step at place 0, named, runs
// again with its side effects; Esc changes nothing, the confirm waives the
// step: the renamed step runs once, the run completes and its page lists
// the waived step, without the actions.
func TestBrowserBlockedRun(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t, testToken)
	b := newBrowser(t)
	const id = "signup-7"
	blocked := e.Block(id)
	e.Start("waiter", "running-1", map[string]any{"n": 1})
	first, renamed := blocktest.StepID(id, blocktest.First), blocktest.StepID(id, blocktest.Renamed)
	login(t, b, e)

	// The list: a badge of its own, counted, and the filter.
	b.waitFor("the blocked row", `document.querySelector('#runs-body tr[data-run-id="signup-7"]')?.dataset.status === "blocked"`)
	var badge struct {
		Class, Color, Running string
	}
	b.eval(`(() => {
		const s = document.querySelector('#runs-body tr[data-run-id="signup-7"] .status');
		const r = document.querySelector('#runs-body tr[data-run-id="running-1"] .status');
		return {class: s.className, color: getComputedStyle(s).color, running: getComputedStyle(r).color};
	})()`, &badge)
	require.Equal(t, "status status-blocked", badge.Class)
	require.NotEqual(t, badge.Running, badge.Color, "blocked is not coloured as running")
	b.waitFor("the count", `document.querySelector('#counts [data-count="blocked"] .n')?.textContent === "1"`)
	b.run("filter blocked", chromedp.SetValue("#f-status", "blocked", chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector("#f-status").dispatchEvent(new Event("change"))`, nil))
	b.waitFor("the blocked run only", `location.hash.includes("status=blocked") && document.querySelectorAll("#runs-body tr").length === 1`)
	var rows [][]string
	b.eval(rowsJS, &rows)
	require.Equal(t, [][]string{{id, "blocked"}}, rows)

	// The run page: the block report, as the SDK reads it.
	b.run("open the run", chromedp.Click(`#runs-body tr[data-run-id="signup-7"] a`, chromedp.ByQuery))
	b.waitFor("the block report", `document.querySelector("#run-id")?.textContent === "signup-7" && document.querySelector("#block") !== null`)
	require.Equal(t, "blocked", b.text("#run-status"))
	div := blocked.Block.Divergence
	require.Equal(t, string(div.Kind), b.text("#block-kind"))
	require.Equal(t, "0", b.text("#block-place"))
	require.Equal(t, "step send-welcome ("+first+")", b.text("#block-history"))
	require.Equal(t, "step send-welcome-email ("+renamed+")", b.text("#block-code"))
	require.Equal(t, div.Detail, b.text("#block-detail"))
	require.Equal(t, blocktest.Build, b.text("#block-build"))
	require.Equal(t, utc(blocked.Block.Since), b.text("#block-since"))
	var since string
	b.eval(`document.querySelector("#block").dataset.since`, &since)
	require.Equal(t, blocked.Block.Since.UTC().Format(time.RFC3339Nano), since)
	requireOneTimeFormat(t, b)
	for _, sel := range []string{"#unblock-run", "#accept-divergence", "#cancel-run"} {
		b.waitFor(sel, `document.querySelector(`+jsString(sel)+`) !== null`)
	}
	b.screenshot("inspector-run-blocked")

	// Unblock: replayed with the same code, blocked again later.
	b.run("unblock", chromedp.Click("#unblock-run", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	require.Contains(t, b.text("#confirm-text"), "replayed with the code the workers run now")
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the answer", `document.querySelector("#action-result")?.textContent === "Run signup-7 unblocked: running, replayed with the workers' code."`)
	b.waitFor("blocked again", `document.querySelector("#block") !== null && document.querySelector("#block").dataset.since !== `+jsString(since))
	again := e.RequireRun(id, jetflow.StatusBlocked, 0, "the replay blocked it again")
	require.True(t, again.Block.Since.After(blocked.Block.Since))
	require.Zero(t, e.Signup.Effects(renamed))

	// Accept divergence: the dialog says what runs again; Esc changes
	// nothing.
	b.waitFor("the accept button", `document.querySelector("#accept-divergence") !== null`)
	b.run("accept", chromedp.Click("#accept-divergence", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	text := b.text("#confirm-text")
	for _, want := range []string{
		"The history's step send-welcome (" + first + ") is waived",
		"The step at place 0, send-welcome-email (" + renamed + "), runs again: its side effects repeat",
	} {
		require.Contains(t, text, want)
	}
	require.Equal(t, "Accept and run again", b.text("#confirm-ok"))
	b.run("Esc", chromedp.KeyEvent(kb.Escape))
	b.waitFor("the dialog closed", `!document.querySelector("#confirm").open`)
	e.RequireRun(id, jetflow.StatusBlocked, 0, "Esc accepts nothing")
	require.Zero(t, e.Signup.Effects(renamed))

	b.run("accept", chromedp.Click("#accept-divergence", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the answer and the run completed", `document.querySelector("#action-result")?.textContent === "Run signup-7 unblocked: running, without step `+first+` of its history (waived)." && document.querySelector("#run-status")?.textContent === "completed"`)
	run := e.Wait(id)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, []string{first}, run.Waived)
	require.Equal(t, 1, e.Signup.Effects(first))
	require.Equal(t, 1, e.Signup.Effects(renamed), "the accepted step ran once")
	require.Equal(t, first, b.text("#run-waived"))
	var left int
	b.eval(`document.querySelectorAll("#block, #unblock-run, #accept-divergence, #cancel-run").length`, &left)
	require.Zero(t, left, "an ended run has no block and no such action")
}

// A block that names no step of the history to waive offers no "Accept
// divergence" (the API would refuse it), and says why; Unblock stays.
// The page is served a run whose block is an input that no longer
// decodes, as the API describes it.
func TestBrowserBlockWithNothingToWaive(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Block("signup-8")
	b.navigate(e.Srv.URL + "/ui/#/runs/signup-8")
	b.waitFor("the block report", `document.querySelector("#block") !== null && document.querySelector("#accept-divergence") !== null`)
	require.False(t, exists(b, "#block-nothing"), "a rename has a step to waive")

	// The same page over a block without a history step: drawn by the
	// page's own code from the run it read, with the report edited.
	b.eval(`(() => {
		const orig = window.fetch;
		window.fetch = async (url, opts) => {
			const res = await orig(url, opts);
			if (!String(url).endsWith("/v1/runs/signup-8")) return res;
			const run = await res.json();
			run.block.divergence = {kind: "input-changed", position: 0, detail: "the input does not decode"};
			return new Response(JSON.stringify(run), {status: res.status, headers: res.headers});
		};
	})()`, nil)
	b.waitFor("the report without a step to waive", `document.querySelector("#block-kind")?.textContent === "input-changed"`)
	require.Equal(t, "Nothing to waive: only code that replays the run moves it on, or cancel it.", b.text("#block-nothing"))
	require.False(t, exists(b, "#accept-divergence"))
	require.True(t, exists(b, "#unblock-run"))
	require.Equal(t, "none", b.text("#block-history"))
}

// exists reports whether an element matches sel.
func exists(b *browser, sel string) bool {
	b.t.Helper()
	var n int
	b.eval(`document.querySelectorAll(`+jsString(sel)+`).length`, &n)
	return n > 0
}

// login logs b in to e's inspector with testToken and waits for the list.
func login(t *testing.T, b *browser, e *inspectortest.Env) {
	t.Helper()
	b.navigate(e.Srv.URL + "/ui/")
	b.waitFor("the login form", `document.querySelector("#token") !== null`)
	_, err := chromedp.RunResponse(b.ctx, chromedp.SendKeys("#token", testToken, chromedp.ByQuery), chromedp.Submit("#token", chromedp.ByQuery))
	require.NoError(t, err)
	b.waitFor("the list", `document.querySelector("#runs-body") !== null`)
}
