package inspector_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// utc is a time as the page shows every time: UTC, to the second.
func utc(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") + " UTC" }

// timeFormat is utc's format.
var timeFormat = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`)

// timesJS is every time element of the view: its text, its datetime
// attribute and its tooltip.
const timesJS = `[...document.querySelectorAll("#view time")].map(t => [t.textContent, t.dateTime, t.title])`

// requireOneTimeFormat requires that every time the view shows is in the
// one format (utc) and is the time its element stands for, with how long
// ago (or how soon) in its tooltip.
func requireOneTimeFormat(t *testing.T, b *browser) {
	t.Helper()
	var times [][]string
	b.eval(timesJS, &times)
	require.NotEmpty(t, times)
	for _, tm := range times {
		if tm[1] == "" {
			require.Equal(t, "—", tm[0], "a time element without a time")
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, tm[1])
		require.NoError(t, err)
		require.Regexp(t, timeFormat, tm[0])
		require.Equal(t, utc(at), tm[0], "the time in UTC, whatever the browser's zone (%s)", browserTZ)
		require.Regexp(t, `^(now|in .+|.+ ago) · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC$`, tm[2], "the tooltip: relative, then to the millisecond")
	}
}

// The runs list shows each run's attributes, when it started (its age:
// created_at, not its last change), how long it ran or has run, and why
// it failed; every time on the page is UTC in one format (the browser's
// zone is not UTC), the time-range filter included; "Log out" is not
// shown when the server has no tokens.
func TestBrowserRunListColumns(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Start("echo", "col-1", map[string]any{"n": 1}, jetflow.WithAttributes(map[string]string{"order_id": "42", "customer": "7"}))
	e.Start("fails", "col-2", map[string]any{"n": 2})
	e.Wait("col-1")
	e.Wait("col-2")
	e.Start("waiter", "col-3", map[string]any{"n": 3})

	require.EqualValues(t, 200, b.navigate(e.Srv.URL+"/ui/"))
	var offset int
	b.eval(`new Date().getTimezoneOffset()`, &offset)
	require.Equal(t, -330, offset, "the browser runs in %s", browserTZ)
	b.waitFor("three rows", `document.querySelectorAll("#runs-body tr").length === 3`)

	var heads []string
	b.eval(`[...document.querySelectorAll("#runs thead th")].map(th => th.textContent)`, &heads)
	require.Equal(t, []string{"Status", "Run ID", "Workflow", "Attributes", "Started", "Duration", "Error", "Gen.", "Dupl."}, heads)

	cell := func(runID, col string) string {
		t.Helper()
		var s string
		b.eval(`document.querySelector('#runs-body tr[data-run-id=`+jsString(runID)+`] td.`+col+`').textContent`, &s)
		return s
	}
	for _, id := range []string{"col-1", "col-2", "col-3"} {
		run := e.RequireRun(id, map[string]jetflow.RunStatus{"col-1": jetflow.StatusCompleted, "col-2": jetflow.StatusFailed, "col-3": jetflow.StatusRunning}[id], 0, id)
		var started string
		b.eval(`document.querySelector('#runs-body tr[data-run-id=`+jsString(id)+`] td.c-started time').dateTime`, &started)
		at, err := time.Parse(time.RFC3339Nano, started)
		require.NoError(t, err)
		require.True(t, at.Equal(run.CreatedAt), "%s: Started is when the run was created (%s), not its last change (%s): %s", id, run.CreatedAt, run.UpdatedAt, at)
		require.Equal(t, utc(run.CreatedAt), cell(id, "c-started"))
		require.NotEqual(t, "—", cell(id, "c-dur"), id)
	}
	require.Equal(t, "customer=7, order_id=42", cell("col-1", "c-attrs"))
	require.Equal(t, "—", cell("col-2", "c-attrs"))
	require.Equal(t, "the card was declined", cell("col-2", "c-err"))
	require.Empty(t, cell("col-1", "c-err"))
	require.Empty(t, cell("col-3", "c-err"))
	requireOneTimeFormat(t, b)
	var live string
	b.eval(`document.querySelector("#live").textContent`, &live)
	require.Regexp(t, `^updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`, live)

	// The running run's duration grows with the clock; an ended run's is
	// from its start to its end.
	before := cell("col-3", "c-dur")
	b.waitFor("the running run's duration to move", `document.querySelector('#runs-body tr[data-run-id="col-3"] td.c-dur').textContent !== `+jsString(before))
	var title string
	b.eval(`document.querySelector('#runs-body tr[data-run-id="col-2"] td.c-dur').title`, &title)
	run := e.RequireRun("col-2", jetflow.StatusFailed, 0, "col-2")
	require.Equal(t, "ended "+utc(run.UpdatedAt), title)

	// An attribute is a link to the runs that share it.
	b.run("follow an attribute", chromedp.Click(`#runs-body tr[data-run-id="col-1"] td.c-attrs a`, chromedp.ByQuery))
	b.waitFor("the runs of that attribute", `location.hash.includes("attr.") && document.querySelectorAll("#runs-body tr").length === 1`)

	// The time range is typed in UTC: the page's address holds what was
	// typed, as UTC.
	b.run("clear", chromedp.Navigate(e.Srv.URL+"/ui/#/"))
	b.waitFor("the list", `document.querySelectorAll("#runs-body tr").length === 3`)
	since := run.CreatedAt.UTC().Add(-time.Hour).Truncate(time.Second)
	b.run("type a start of the range", chromedp.SetValue("#f-since", since.Format("2006-01-02T15:04:05"), chromedp.ByQuery),
		chromedp.Click(`.filters button[type="submit"]`, chromedp.ByQuery))
	b.waitFor("the range in the address", `location.hash.includes("since=")`)
	var got string
	b.eval(`new URLSearchParams(location.hash.split("?")[1]).get("since")`, &got)
	require.Equal(t, since.Format("2006-01-02T15:04:05.000Z"), got)
	b.waitFor("the three runs, changed since", `document.querySelectorAll("#runs-body tr").length === 3`)
	var shown string
	b.eval(`document.querySelector("#f-since").value`, &shown)
	require.Equal(t, since.Format("2006-01-02T15:04:05"), shown, "the field shows the range in UTC")

	// No tokens: nothing to log out of.
	var logout bool
	b.eval(`document.querySelector("#logout") !== null || document.body.innerText.includes("Log out")`, &logout)
	require.False(t, logout, "no Log out without tokens")
}
