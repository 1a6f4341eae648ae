package inspector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// open goes to url, which may differ from the page's address in its
// fragment only (a navigation without a response, unlike navigate's).
func (b *browser) open(url string) {
	b.t.Helper()
	b.run("open "+url, chromedp.Navigate(url))
}

// openWaits polls Client.Describe until runID has n open waits, and
// returns them.
func openWaits(t *testing.T, e *inspectortest.Env, runID string, n int) []jetflow.OpenWait {
	t.Helper()
	var d jetflow.RunDescription
	require.Eventually(t, func() bool {
		var err error
		d, err = e.Client.Describe(ctxT(t, 10*time.Second), runID)
		require.NoError(t, err)
		return len(d.Waits) == n
	}, 30*time.Second, 20*time.Millisecond, "%s begins %d wait(s)", runID, n)
	return d.Waits
}

// shownWait is what the run page shows of an open wait: its row in the
// "Waiting for" table and its step in the timeline.
type shownWait struct {
	Kind, What, Since, SinceAt, Until, UntilAt string
	Bars                                       []string // the classes of its bars in the timeline
	Label                                      string   // its timeline row's label
	Note                                       string   // its timeline note
	Ends                                       []float64
}

func (b *browser) shownWait(stepID string) shownWait {
	b.t.Helper()
	sel := jsString(`[data-step-id="` + stepID + `"]`)
	var w shownWait
	b.eval(`(() => {
		const row = document.querySelector("#waits tr.wait" + `+sel+`);
		const step = document.querySelector("#timeline .open-wait" + `+sel+`);
		const bars = [...step.querySelectorAll(".tl-track .bar")];
		const track = step.querySelector(".tl-track").getBoundingClientRect();
		return {
			Kind: row.dataset.kind,
			What: row.querySelector(".w-what").textContent,
			Since: row.querySelector(".w-since time").textContent,
			SinceAt: row.querySelector(".w-since time").dateTime,
			Until: row.querySelector(".w-until time")?.textContent ?? row.querySelector(".w-until").textContent,
			UntilAt: row.querySelector(".w-until time")?.dateTime ?? "",
			Bars: bars.map(b => b.className),
			Label: step.querySelector(".tl-label").textContent,
			Note: step.querySelector(".step-notes").textContent,
			Ends: bars.map(b => { const r = b.getBoundingClientRect(); return (r.right - track.left) / track.width; }),
		};
	})()`, &w)
	return w
}

// requireSince requires that the page shows the wait's start, as the API
// has it.
func requireSince(t *testing.T, w jetflow.OpenWait, shown shownWait) {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, shown.SinceAt)
	require.NoError(t, err)
	require.True(t, at.Equal(w.Since), "since %s, shown %s", w.Since, at)
	require.Equal(t, utc(w.Since), shown.Since)
}

// A run's page says what the run waits for — a sleep's end, an event (with
// a timeout), a hook's token (no deadline), a child run (a link) — since
// when and until when ("no deadline" when it has none), as Client.Describe
// lists the open waits; the timeline draws each open wait as a bar of its
// own kind from its start to now, then an outline from now to its
// deadline (open-ended when the deadline lies past the axis), none
// without a deadline. It writes the screenshots of a sleeping run, a run
// waiting for an event and one waiting for a hook.
func TestBrowserWaits(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Start("sleeper", "cooloff-5", map[string]any{"order": 5, "items": 3})
	e.Start("payment", "order-311", map[string]any{"order": 311, "amount_cents": 4200})
	e.Start("approval", "refund-12", map[string]any{"order": 12, "reason": "damaged"})
	e.Start("parent", "batch-4", map[string]any{"batch": 4})

	// A sleep: its end is its deadline, an hour away, past the axis.
	sleep := openWaits(t, e, "cooloff-5", 1)[0]
	require.Equal(t, "sleep", sleep.Kind)
	require.Equal(t, "cool-off", sleep.Name)
	require.False(t, sleep.Until.IsZero())
	b.open(e.Srv.URL + "/ui/#/runs/cooloff-5")
	b.waitFor("the sleep", `document.querySelector('#waits tr.wait') !== null && document.querySelector("#timeline .open-wait") !== null`)
	shown := b.shownWait(sleep.StepID)
	require.Equal(t, "sleep", shown.Kind)
	require.Equal(t, "the sleep's end", shown.What)
	requireSince(t, sleep, shown)
	require.Equal(t, utc(sleep.Until), shown.Until)
	at, err := time.Parse(time.RFC3339Nano, shown.UntilAt)
	require.NoError(t, err)
	require.True(t, at.Equal(sleep.Until))
	require.Equal(t, []string{"bar waiting", "bar wait-left beyond"}, shown.Bars, "waiting until now, then on past the axis's end")
	require.InDelta(t, 1, shown.Ends[1], 0.01, "the deadline lies past the axis: the bar runs to its end")
	require.Less(t, shown.Ends[0], shown.Ends[1])
	require.Regexp(t, `^waiting · deadline in (59m|1h)`, shown.Label)
	require.Contains(t, shown.Note, "waits for the sleep's end · since "+utc(sleep.Since)+" · until "+utc(sleep.Until))
	// Its bar is not a step's: another colour, another pattern.
	var looks []string
	b.eval(`[...document.querySelectorAll("#timeline .attempt .bar, #timeline .open-wait .bar.waiting")].map(b => getComputedStyle(b).backgroundImage + " " + getComputedStyle(b).backgroundColor)`, &looks)
	require.Len(t, looks, 2, "the reserve step's bar, and the sleep's")
	require.NotEqual(t, looks[0], looks[1])
	requireOneTimeFormat(t, b)
	b.screenshot("inspector-wait-sleep")

	// The clock moves the bar, not the page: a refresh of the unchanged
	// run redraws the waits with the time waited.
	var waited string
	b.eval(`document.querySelector("#timeline .open-wait .tl-dur").textContent`, &waited)
	b.waitFor("the time waited to move", `document.querySelector("#timeline .open-wait .tl-dur").textContent !== `+jsString(waited))

	// An event, with a timeout.
	paid := openWaits(t, e, "order-311", 1)[0]
	require.Equal(t, "event", paid.Kind)
	require.Equal(t, "paid", paid.Event)
	require.WithinDuration(t, paid.Since.Add(inspectortest.PaymentWithin), paid.Until, time.Second)
	b.open(e.Srv.URL + "/ui/#/runs/order-311")
	b.waitFor("the event wait", `document.querySelector('#waits tr.wait[data-kind="event"]') !== null`)
	shown = b.shownWait(paid.StepID)
	require.Equal(t, "event paid", shown.What)
	requireSince(t, paid, shown)
	require.Equal(t, utc(paid.Until), shown.Until)
	require.Equal(t, []string{"bar waiting", "bar wait-left beyond"}, shown.Bars)
	require.Contains(t, shown.Note, "waits for event paid · since ")
	var left string
	b.eval(`document.querySelector("#waits tr.wait .w-until").textContent`, &left)
	require.Regexp(t, `· 2[34]h \d\dm left$`, left)
	b.screenshot("inspector-wait-event")

	// A hook: its token, and no deadline.
	hook := openWaits(t, e, "refund-12", 1)[0]
	require.Equal(t, "hook", hook.Kind)
	require.Equal(t, "approve-12", hook.HookToken)
	require.True(t, hook.Until.IsZero())
	b.open(e.Srv.URL + "/ui/#/runs/refund-12")
	b.waitFor("the hook wait", `document.querySelector('#waits tr.wait[data-kind="hook"]') !== null`)
	shown = b.shownWait(hook.StepID)
	require.Equal(t, "a resume of hook token approve-12 (event approved)", shown.What)
	requireSince(t, hook, shown)
	require.Equal(t, "no deadline", shown.Until)
	require.Equal(t, "", shown.UntilAt)
	require.Equal(t, []string{"bar waiting"}, shown.Bars, "no deadline: no bar beyond now")
	require.Equal(t, "waiting · no deadline", shown.Label)
	require.Contains(t, shown.Note, "· no deadline")
	b.screenshot("inspector-wait-hook")

	// A child run: a link to it.
	child := openWaits(t, e, "batch-4", 1)[0]
	require.Equal(t, "child", child.Kind)
	require.Equal(t, "batch-4-child", child.ChildRunID)
	b.open(e.Srv.URL + "/ui/#/runs/batch-4")
	b.waitFor("the child wait", `document.querySelector('#waits tr.wait[data-kind="child"]') !== null`)
	shown = b.shownWait(child.StepID)
	require.Equal(t, "child run batch-4-child to end", shown.What)
	require.Equal(t, "no deadline", shown.Until)
	var href string
	b.eval(`document.querySelector("#waits .wait-child").getAttribute("href")`, &href)
	require.Equal(t, "#/runs/batch-4-child", href)

	// The event comes: the wait is a step of the run, and the run has no
	// open wait left.
	_, err = e.Client.SendEvent(ctxT(t, 10*time.Second), "order-311", "paid", "evt-311", []byte(`{"txn":"t-311"}`))
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, e.Wait("order-311").Status)
	b.open(e.Srv.URL + "/ui/#/runs/order-311")
	b.waitFor("the completed run", `document.querySelector("#run-status")?.textContent === "completed"`)
	var waits, openSteps int
	b.eval(`document.querySelectorAll("#waits").length`, &waits)
	b.eval(`document.querySelectorAll("#timeline .open-wait").length`, &openSteps)
	require.Zero(t, waits, "no Waiting for section")
	require.Zero(t, openSteps, fmt.Sprintf("no open wait in the timeline of %s", "order-311"))
	// In call order: the invoice, then the wait the event ended, though
	// the event's sender committed it without a place of its own.
	var stepIDs []string
	b.eval(`[...new Set([...document.querySelectorAll("#timeline .step-id")].map(s => s.textContent))]`, &stepIDs)
	require.Equal(t, []string{"order-311.invoice.0", "order-311.event=paid.0"}, stepIDs)
}
