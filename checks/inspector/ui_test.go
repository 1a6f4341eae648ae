package inspector_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// rowsJS is the list's rows as [run ID, status] pairs.
const rowsJS = `[...document.querySelectorAll("#runs-body tr")].map(r => [r.dataset.runId, r.dataset.status])`

// The runs list shows the runs, filters them by status, finds a run by its
// ID, and the run page shows what Client.GetRun and Client.Steps say: the
// status, the duplicate starts, each step's ID as its Idempotency-Key and
// its attempts (a step that failed twice shows three).
func TestBrowserListFilterSearchAndRunPage(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)

	for _, id := range []string{"echo-1", "echo-2", "echo-3"} {
		e.Start("echo", id, map[string]any{"n": id})
	}
	e.Start("fails", "refund-77", map[string]any{"order": 77})
	input := map[string]any{"order_id": "o-1042", "amount_cents": 1999, "currency": "usd"}
	attrs := jetflow.WithAttributes(map[string]string{"order_id": "o-1042", "customer": "c-7"})
	require.Equal(t, jetflow.OutcomeCreated, e.Start("flaky", "order-1042", input, attrs).Outcome)
	require.Equal(t, jetflow.OutcomeExisting, e.Start("flaky", "order-1042", input, attrs).Outcome, "a duplicate start")
	for _, id := range []string{"echo-1", "echo-2", "echo-3", "refund-77", "order-1042"} {
		e.Wait(id)
	}
	e.Start("waiter", "shipment-9", map[string]any{"carrier": "ups"})

	// The list: every run, newest first.
	require.EqualValues(t, 200, b.navigate(e.Srv.URL+"/ui/"))
	b.waitFor("six rows", `document.querySelectorAll("#runs-body tr").length === 6`)
	var rows [][]string
	b.eval(rowsJS, &rows)
	got := map[string]string{}
	for _, r := range rows {
		got[r[0]] = r[1]
	}
	require.Equal(t, map[string]string{"echo-1": "completed", "echo-2": "completed", "echo-3": "completed",
		"refund-77": "failed", "order-1042": "completed", "shipment-9": "running"}, got)
	counts, err := e.Client.CountRuns(ctxT(t, 10*time.Second), "")
	require.NoError(t, err)
	require.Equal(t, jetflow.RunCounts{Running: 1, Completed: 4, Failed: 1}, counts)
	b.waitFor("the counts", `document.querySelector('#counts [data-count="completed"] .n')?.textContent === "4"`)
	var shown map[string]string
	b.eval(`Object.fromEntries([...document.querySelectorAll("#counts [data-count]")].map(a => [a.dataset.count, a.querySelector(".n").textContent]))`, &shown)
	require.Equal(t, map[string]string{"running": "1", "blocked": "0", "completed": "4", "failed": "1", "cancelled": "0"}, shown)
	b.screenshot("inspector-runs")

	// The live refresh updates the rows in place: the same elements, one
	// fixed height.
	b.eval(`window.__row = document.querySelector("#runs-body tr"); window.__stamp = document.querySelector("#live").textContent`, nil)
	b.waitFor("a refresh", `document.querySelector("#live").textContent !== window.__stamp`)
	var same bool
	b.eval(`document.querySelector("#runs-body tr") === window.__row`, &same)
	require.True(t, same, "a refresh keeps the row elements")
	var heights []float64
	b.eval(`[...new Set([...document.querySelectorAll("#runs-body tr")].map(r => r.getBoundingClientRect().height))]`, &heights)
	require.Len(t, heights, 1, "every row has one height: %v", heights)

	// Filter by status: the failed run only.
	b.run("filter failed", chromedp.SetValue("#f-status", "failed", chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector("#f-status").dispatchEvent(new Event("change"))`, nil))
	b.waitFor("the failed run only", `location.hash.includes("status=failed") && document.querySelectorAll("#runs-body tr").length === 1`)
	b.eval(rowsJS, &rows)
	require.Equal(t, [][]string{{"refund-77", "failed"}}, rows)

	// Search by run ID: "/" focuses the search box; Enter finds the run.
	b.run("clear filters", chromedp.Navigate(e.Srv.URL+"/ui/#/"))
	b.waitFor("the list", `document.querySelectorAll("#runs-body tr").length === 6`)
	b.run("search", chromedp.KeyEvent("/"))
	b.waitFor("/ to focus the search box", `document.activeElement.id === "search"`)
	// The protocol sends "/" as a key press and a separate character,
	// which (unlike a real key press) the page's preventDefault does not
	// suppress: clear what it may have typed.
	b.run("type the run ID", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "order-1042"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the exact match", `document.querySelector("#exact-link")?.textContent === "order-1042"`)
	b.waitFor("the one run with that prefix", `location.hash.includes("prefix=order-1042") && document.querySelectorAll("#runs-body tr").length === 1`)

	// A prefix lists the runs whose IDs start with it.
	b.run("search a prefix", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "echo-"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the echo runs", `location.hash.includes("prefix=echo-") && document.querySelectorAll("#runs-body tr").length === 3`)
	b.eval(rowsJS, &rows)
	for _, r := range rows {
		require.True(t, strings.HasPrefix(r[0], "echo-"), r[0])
	}
	require.True(t, b.hidden("#exact"), "no run is called echo- exactly")
	b.run("search the run again", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "order-1042"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the exact match", `location.hash.includes("prefix=order-1042") && document.querySelector("#exact-link")?.textContent === "order-1042"`)

	// The run page, against the SDK's view of the run.
	run, err := e.Client.GetRun(ctxT(t, 10*time.Second), "order-1042")
	require.NoError(t, err)
	steps, err := e.Client.Steps(ctxT(t, 10*time.Second), "order-1042")
	require.NoError(t, err)
	b.run("open the run", chromedp.Click("#exact-link", chromedp.ByQuery))
	b.waitFor("the run page", `document.querySelector("#run-id")?.textContent === "order-1042" && document.querySelector("#timeline .step")`)
	require.Equal(t, string(run.Status), b.text("#run-status"))
	require.Equal(t, run.Workflow, b.text("#run-workflow"))
	require.EqualValues(t, 1, run.Duplicates)
	require.Equal(t, "1", b.text("#duplicates-count"))
	var dupRows int
	b.eval(`document.querySelectorAll("#duplicates tr.dup").length`, &dupRows)
	require.Equal(t, 1, dupRows, "the duplicate start's row (when, source, outcome, fingerprint match)")
	require.Contains(t, b.text("#duplicates"), "existing")

	var stepIDs []string
	b.eval(`[...document.querySelectorAll("#timeline .step-id")].map(s => s.textContent)`, &stepIDs)
	want := make([]string, len(steps))
	for i, s := range steps {
		want[i] = s.StepID
	}
	require.Equal(t, want, stepIDs, "every committed step, in call order, with its step ID as Idempotency-Key")
	charge := steps[0]
	require.Equal(t, "charge", charge.Name)
	require.Equal(t, inspectortest.FlakyFailures+1, charge.Attempt, "the SDK's count: committed on the third attempt")
	var attempts []string
	b.eval(`[...document.querySelectorAll('#timeline .attempt[data-step-id=`+jsString(charge.StepID)+`]')].map(a => a.dataset.attempt)`, &attempts)
	require.NotEmpty(t, attempts)
	require.Equal(t, "3", attempts[len(attempts)-1], "the committed attempt's number")
	require.Len(t, charge.Attempts, inspectortest.FlakyFailures, "the SDK's failed attempts")
	require.Equal(t, len(charge.Attempts)+1, len(attempts), "a bar per attempt: the failed ones and the committed one")
	var failed int
	b.eval(`document.querySelectorAll('#timeline .attempt-failed[data-step-id=`+jsString(charge.StepID)+`]').length`, &failed)
	require.Equal(t, inspectortest.FlakyFailures, failed)
	require.Contains(t, b.text("#timeline"), "attempt 1: payment service timed out (attempt 1)")
	require.Contains(t, b.text("#run-input"), `"order_id": "o-1042"`)
	require.Contains(t, b.text("#timeline"), "task key")
	b.screenshot("inspector-run")

	// Reset the receipt step's task key: the dialog asks for the key the
	// step was called with (the stored one is a hash), in the stored key's
	// scope (the run).
	b.run("reset the key", chromedp.Click("#timeline .reset-key", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open && document.querySelector("#confirm-input")`)
	b.run("type the key", chromedp.SendKeys("#confirm-input", "receipt-ch_1", chromedp.ByQuery), chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the answer", `document.querySelector("#action-result")?.textContent.includes("removed")`)
	require.Equal(t, "Task key reset (scope run): 1 stored result(s) removed.", b.text("#action-result"))
	n, err := e.Client.ResetTaskKey(ctxT(t, 10*time.Second), "receipt-ch_1", jetflow.ScopeRun, "order-1042")
	require.NoError(t, err)
	require.Zero(t, n, "the page's reset removed the key")

	// The running run (its wait is not a step until the event comes) has a
	// cancel button.
	b.run("open the running run", chromedp.Navigate(e.Srv.URL+"/ui/#/runs/shipment-9"))
	b.waitFor("the running run", `document.querySelector("#run-id")?.textContent === "shipment-9" && document.querySelector("#cancel-run")`)
	require.Equal(t, "running", b.text("#run-status"))
	b.screenshot("inspector-run-running")
	require.True(t, strings.Contains(b.text("#run-input"), `"carrier": "ups"`))
}

// A running run (waiting for an event) is cancelled from its page through
// the confirmation dialog: the page's refresh keeps the cancel button in
// place; Esc closes the dialog and changes nothing; a
// dialog dismissed and opened again before its close event is dispatched
// still takes the confirm (the stale event once answered the new opening
// "dismissed", and the confirmed cancel was silently dropped); while the
// cancel is on its way the page says so, then shows the answer and the
// new status. The cancelled run is then started again: a request that
// fails on the way shows an error and changes nothing, and the next try
// starts the run again, with the same input, as a new generation.
func TestBrowserCancelAndStartAgain(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	input := map[string]any{"carrier": "ups", "parcel": 7}
	e.Start("waiter", "parcel-7", input)

	b.navigate(e.Srv.URL + "/ui/#/runs/parcel-7")
	b.waitFor("the cancel button", `document.querySelector("#cancel-run") !== null`)
	// A refresh of the unchanged running run moves its clock, not its
	// buttons: a click whose press and release straddle a refresh lands.
	b.eval(`window.__cancel = document.querySelector("#cancel-run"); window.__ran = document.querySelector("#run-duration").textContent`, nil)
	b.waitFor("a refresh", `document.querySelector("#run-duration").textContent !== window.__ran`)
	var same bool
	b.eval(`document.querySelector("#cancel-run") === window.__cancel`, &same)
	require.True(t, same, "a refresh keeps the cancel button")
	b.run("open the dialog", chromedp.Click("#cancel-run", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("Esc", chromedp.KeyEvent(kb.Escape))
	b.waitFor("the dialog closed", `!document.querySelector("#confirm").open`)
	e.RequireRun("parcel-7", jetflow.StatusRunning, 0, "Esc cancels the dialog, not the run")

	// Open, dismiss and open again in one task of the page: the dismissal's
	// close event is dispatched after the second opening (Chromium
	// dispatches it at the next animation frame, which a loaded machine
	// delays past a quick second click).
	b.eval(`(() => {
		document.querySelector("#cancel-run").click();
		document.querySelector("#confirm").close();
		document.querySelector("#cancel-run").click();
	})()`, nil)
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	arrived, decide := e.Hold("POST", "/v1/runs/parcel-7/cancel")
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the cancel on its way", `!document.querySelector("#confirm").open && document.querySelector("#action-result")?.textContent === "Cancelling run parcel-7…"`)
	e.Arrives(arrived, "the page's cancel", waitTimeout)
	e.RequireRun("parcel-7", jetflow.StatusRunning, 0, "the cancel is held")
	decide(true)
	// The answer, with the status: a periodic refresh may draw the new
	// status before the page's own read after the cancel answers.
	b.waitFor("the answer and the status cancelled", `document.querySelector("#action-result")?.textContent === "Run parcel-7 cancelled." && document.querySelector("#run-status")?.textContent === "cancelled"`)
	e.RequireRun("parcel-7", jetflow.StatusCancelled, 0, "cancelled from the page")

	// Start again, with the request cut on its way: an error, nothing
	// changed, and the button is still there.
	arrived, decide = e.Hold("POST", "/ui/api/runs/parcel-7/start-again")
	decide(false)
	b.waitFor("the start-again button", `document.querySelector("#start-again") !== null`)
	b.run("start again", chromedp.Click("#start-again", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the error", `document.querySelector("#action-result.err")?.textContent.startsWith("Network error")`)
	e.Arrives(arrived, "the page's start again", waitTimeout)
	e.RequireRun("parcel-7", jetflow.StatusCancelled, 0, "a start again that never reached the server")

	e.Unhold("POST", "/ui/api/runs/parcel-7/start-again")
	b.waitFor("the start-again button", `document.querySelector("#start-again") !== null`)
	b.run("start again", chromedp.Click("#start-again", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the answer and generation 1, running", `document.querySelector("#action-result")?.textContent.includes("started again (restarted)") && document.querySelector("#run-generation")?.textContent === "1" && document.querySelector("#run-status")?.textContent === "running"`)
	run := e.RequireRun("parcel-7", jetflow.StatusRunning, 1, "started again from the page")
	require.JSONEq(t, `{"carrier":"ups","parcel":7}`, string(run.Input), "started again with the same input")
}

// Server data is text: an input and output holding markup show as text,
// and no script of theirs runs.
func TestBrowserShowsMarkupAsText(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	evil := "<script>window.__pwned=1</script>"
	img := `<img src=x onerror="window.__pwned=2">`
	e.Start("echo", "markup-1", map[string]any{"note": evil, "img": img})
	e.Wait("markup-1")

	b.navigate(e.Srv.URL + "/ui/#/runs/markup-1")
	b.waitFor("the run page", `document.querySelector("#run-output")?.textContent.includes("window.__pwned")`)
	in, out := b.text("#run-input"), b.text("#run-output")
	for _, s := range []string{in, out} {
		require.Contains(t, s, `"note": "<script>window.__pwned=1</script>"`)
		require.Contains(t, s, `"img": "<img src=x onerror=\"window.__pwned=2\">"`)
	}
	var scripts, imgs int
	b.eval(`document.querySelectorAll("#view script").length`, &scripts)
	b.eval(`document.querySelectorAll("#view img").length`, &imgs)
	require.Zero(t, scripts)
	require.Zero(t, imgs)
	var pwned string
	b.eval(`typeof window.__pwned`, &pwned)
	require.Equal(t, "undefined", pwned)
}

// A step that failed and waits for its retry is an open step at the end
// of the timeline, with its failed attempt, as Client.OpenSteps lists it.
func TestBrowserOpenStep(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Start("stuck", "partner-3", map[string]any{"n": 3})
	var open []jetflow.OpenStep
	require.Eventually(t, func() bool {
		var err error
		open, err = e.Client.OpenSteps(ctxT(t, 10*time.Second), "partner-3")
		require.NoError(t, err)
		return len(open) == 1 && len(open[0].Attempts) == 1
	}, 30*time.Second, 20*time.Millisecond, "the failed first attempt is recorded")

	b.navigate(e.Srv.URL + "/ui/#/runs/partner-3")
	b.waitFor("the open step", `document.querySelector("#timeline .open-step") !== null`)
	var ids []string
	b.eval(`[...document.querySelectorAll("#timeline .open-step")].map(s => s.dataset.stepId)`, &ids)
	require.Equal(t, []string{open[0].StepID}, ids)
	require.Contains(t, b.text("#timeline .open-step"), "attempt 1: the partner API answers 502")
	var rows []string
	b.eval(`[...document.querySelectorAll("#timeline .open-step .attempt")].map(a => a.dataset.attempt)`, &rows)
	require.Equal(t, []string{"1", "2"}, rows, "the failed attempt, and the next one to come")
}

// A wait whose timeout passed is shown as "timed out" with what it waited
// for, not as an error: no "fatal", no error note, on the run page.
func TestBrowserWaitTimedOut(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Start("verify", "verify-1", map[string]any{"email": "ada@example.com"})
	require.Equal(t, jetflow.StatusCompleted, e.Wait("verify-1").Status, "the wait timed out and the reminder was sent")

	b.navigate(e.Srv.URL + "/ui/#/runs/verify-1")
	b.waitFor("the timed-out wait", `document.querySelector("#timeline .timed-out") !== null`)
	require.Contains(t, b.text("#timeline .timed-out"), "timed out: no event verified within 50ms (at ")
	tl := b.text("#timeline")
	require.NotContains(t, tl, "fatal")
	require.Contains(t, tl, "send-reminder")
	var errs int
	b.eval(`document.querySelectorAll("#timeline .err").length`, &errs)
	require.Zero(t, errs, "no error note: %s", tl)
}

// The search box finds runs by attribute: "order_id=42" lists the runs
// started with that attribute, two terms both, the run page shows a run's
// attributes as links to the runs that share each, and a search box with
// a run ID still finds that run.
func TestBrowserSearchByAttribute(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	attrs := func(order, customer string) jetflow.StartOption {
		return jetflow.WithAttributes(map[string]string{"order_id": order, "customer": customer})
	}
	e.Start("echo", "att-1", map[string]any{"n": 1}, attrs("42", "7"))
	e.Start("echo", "att-2", map[string]any{"n": 2}, attrs("43", "7"))
	e.Start("echo", "att-3", map[string]any{"n": 3}, attrs("42", "8"))
	for _, id := range []string{"att-1", "att-2", "att-3"} {
		e.Wait(id)
	}

	require.EqualValues(t, 200, b.navigate(e.Srv.URL+"/ui/"))
	b.waitFor("three rows", `document.querySelectorAll("#runs-body tr").length === 3`)
	b.run("search an attribute", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "order_id=42"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the runs of order 42", `location.hash.includes("attr.order_id=42") && document.querySelectorAll("#runs-body tr").length === 2`)
	var rows [][]string
	b.eval(rowsJS, &rows)
	require.ElementsMatch(t, [][]string{{"att-1", "completed"}, {"att-3", "completed"}}, rows)
	require.True(t, b.hidden("#exact"), "no run is called order_id=42")

	b.run("search two attributes", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "order_id=42 customer=8"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the one run", `location.hash.includes("attr.customer=8") && document.querySelectorAll("#runs-body tr").length === 1`)
	b.eval(rowsJS, &rows)
	require.Equal(t, [][]string{{"att-3", "completed"}}, rows)
	var box string
	b.eval(`document.querySelector("#search").value`, &box)
	require.Equal(t, "order_id=42 customer=8", box, "the box keeps what was searched")

	b.run("open the run", chromedp.Navigate(e.Srv.URL+"/ui/#/runs/att-2"))
	b.waitFor("the run page", `document.querySelector("#run-id")?.textContent === "att-2"`)
	require.Equal(t, "customer=7, order_id=43", b.text("#run-attributes"))
	b.run("follow an attribute", chromedp.Click(`#run-attributes a`, chromedp.ByQuery))
	b.waitFor("the runs of customer 7", `location.hash.includes("attr.customer=7") && document.querySelectorAll("#runs-body tr").length === 2`)
	b.eval(rowsJS, &rows)
	require.ElementsMatch(t, [][]string{{"att-1", "completed"}, {"att-2", "completed"}}, rows)

	b.run("search a run ID", chromedp.Evaluate(`document.querySelector("#search").value = ""`, nil), chromedp.SendKeys("#search", "att-3"+kb.Enter, chromedp.ByQuery))
	b.waitFor("the exact match", `location.hash.includes("prefix=att-3") && document.querySelector("#exact-link")?.textContent === "att-3"`)
}
