package inspector_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// stepValue is what the timeline shows of a step's value (its output, or
// the payload of the event a wait took): the note's text, whether it is
// collapsed, and its full text.
type stepValue struct {
	Note      string
	Collapsed bool
	Full      string
}

func (b *browser) stepValue(stepID string) stepValue {
	b.t.Helper()
	var v stepValue
	b.eval(`(() => {
		const note = document.querySelector('#timeline .step[data-step-id=`+jsString(stepID)+`] .value-note');
		if (!note) return {Note: "", Collapsed: false, Full: ""};
		const d = note.querySelector("details.value");
		return {Note: note.textContent, Collapsed: !!d && !d.open, Full: d ? d.querySelector("pre").textContent : note.querySelector("code.value").textContent};
	})()`, &v)
	return v
}

// The run page shows each step's output and, for a wait that took an
// event, the event's payload and ID, as Client.Steps has them: as text
// (markup in them stays characters, and runs nothing), in line when
// short, collapsed to their beginning when long, in full on a click; a
// value opened stays open while the page refreshes a running run.
func TestBrowserStepValues(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	long := strings.Repeat("line item; ", 40)
	markup := `<img src=x onerror="window.__pwned=1">`
	e.Start("echo", "values-1", map[string]any{"note": markup, "long": long})
	e.Wait("values-1")

	steps, err := e.Client.Steps(ctxT(t, 10*time.Second), "values-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	b.open(e.Srv.URL + "/ui/#/runs/values-1")
	b.waitFor("the step's output", `document.querySelector("#timeline .value-note") !== null`)
	v := b.stepValue(steps[0].StepID)
	require.True(t, strings.HasPrefix(v.Note, `output {"long":"line item; line item;`), v.Note)
	require.True(t, v.Collapsed, "a long output is collapsed")
	require.Contains(t, v.Note, "characters")
	require.NotContains(t, v.Note, markup, "collapsed: the beginning only")
	b.run("expand", chromedp.Click(`#timeline details.value summary`, chromedp.ByQuery))
	b.waitFor("the full output", `document.querySelector("#timeline details.value").open`)
	v = b.stepValue(steps[0].StepID)
	require.Contains(t, v.Full, `"note": "<img src=x onerror=\"window.__pwned=1\">"`)
	require.Contains(t, v.Full, long)
	var imgs int
	b.eval(`document.querySelectorAll("#view img").length`, &imgs)
	require.Zero(t, imgs)
	var pwned string
	b.eval(`typeof window.__pwned`, &pwned)
	require.Equal(t, "undefined", pwned)

	// An event's payload, with markup, and its ID.
	e.Start("payment", "order-312", map[string]any{"order": 312})
	openWaits(t, e, "order-312", 1)
	_, err = e.Client.SendEvent(ctxT(t, 10*time.Second), "order-312", "paid", "evt-312", []byte(`{"txn":"<b>t-312</b>","amount_cents":4200}`))
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, e.Wait("order-312").Status)
	steps, err = e.Client.Steps(ctxT(t, 10*time.Second), "order-312")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	invoice, paid := steps[0], steps[1]
	require.Equal(t, "evt-312", paid.EventID)
	b.open(e.Srv.URL + "/ui/#/runs/order-312")
	b.waitFor("the payload", `document.querySelectorAll("#timeline .value-note").length === 2`)
	v = b.stepValue(invoice.StepID)
	require.Equal(t, `output "inv-order-312"`, v.Note)
	require.False(t, v.Collapsed)
	v = b.stepValue(paid.StepID)
	require.Equal(t, `payload {"amount_cents":4200,"txn":"<b>t-312</b>"}`, v.Note, "short: in line")
	var eventID string
	b.eval(`document.querySelector('#timeline .step[data-step-id=`+jsString(paid.StepID)+`] .event-id').textContent`, &eventID)
	require.Equal(t, "evt-312", eventID)
	var bolds int
	b.eval(`document.querySelectorAll("#view b:not(.idem b)").length`, &bolds)
	require.Zero(t, bolds, "the payload's markup is text")

	// A running run's long output, opened, stays open across refreshes.
	e.Start("sleeper", "cooloff-7", map[string]any{"order": 7, "items": strings.Repeat("widget ", 30)})
	openWaits(t, e, "cooloff-7", 1)
	b.open(e.Srv.URL + "/ui/#/runs/cooloff-7")
	b.waitFor("the reserve step's output", `document.querySelector("#timeline details.value") !== null`)
	b.run("expand", chromedp.Click(`#timeline details.value summary`, chromedp.ByQuery))
	b.waitFor("open", `document.querySelector("#timeline details.value").open`)
	b.eval(`window.__stamp = document.querySelector("#live").textContent`, nil)
	b.waitFor("a refresh", `document.querySelector("#live").textContent !== window.__stamp`)
	b.eval(`window.__stamp = document.querySelector("#live").textContent`, nil)
	b.waitFor("another refresh", `document.querySelector("#live").textContent !== window.__stamp`)
	var open bool
	b.eval(`document.querySelector("#timeline details.value").open`, &open)
	require.True(t, open, "the output opened stays open")
}
