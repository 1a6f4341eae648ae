package inspector_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// checkout reserves, charges and ships; its charge fails for good (Fatal)
// while declined is set. Every step function counts its calls by step ID
// in effects: a step kept by a rerun is never called again.
type checkout struct {
	declined atomic.Bool
	mu       sync.Mutex
	effects  map[string]int
}

func (c *checkout) workflow() *jetflow.Workflow[map[string]any, string] {
	effect := func(name string) func(context.Context) (string, error) {
		return func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			c.mu.Lock()
			c.effects[info.StepID]++
			c.mu.Unlock()
			if name == "charge" && c.declined.Load() {
				return "", jetflow.Fatal(errors.New("the card was declined"))
			}
			return name + " done", nil
		}
	}
	return jetflow.NewWorkflow("checkout", func(ctx *jetflow.Context, in map[string]any) (string, error) {
		for _, name := range []string{"reserve", "charge"} {
			if _, err := jetflow.Step(ctx, name, effect(name)); err != nil {
				return "", err
			}
		}
		return jetflow.Step(ctx, "ship", effect("ship"))
	})
}

func (c *checkout) calls() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.effects))
	for k, v := range c.effects {
		out[k] = v
	}
	return out
}

// stepIDsJS is the step IDs of the list sel's items.
func stepIDsJS(sel string) string {
	return `[...document.querySelectorAll(` + jsString(sel) + `)].map(e => e.dataset.stepId)`
}

// A failed run is rerun from its page. "Rerun…" is the primary action and
// "Start again…" a secondary one, whose dialog says that every step runs
// again with its side effects. Rerun… plans first (a dry run, which
// starts nothing): its dialog names the new run and lists the steps kept
// (never run again) and the steps run again under new step IDs, as
// Client.Rerun plans them; Esc starts nothing. Confirmed, the result line
// says the rerun was created and links to it; the source's page lists it
// under Reruns; the rerun completes without calling the kept step again,
// and its page says "Rerun of" with links to the source and its from
// step, which the source's timeline marks. Rerun… again finds the same
// run (existing) and starts nothing; "Rerun from here…" on the first step
// reruns that step and the rest under a run of its own.
func TestBrowserRerun(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	co := &checkout{effects: map[string]int{}}
	co.declined.Store(true)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(co.workflow()))
	e.Worker("checkout-worker", ws)

	const src = "order-7"
	reserve, charge := src+".reserve.0", src+".charge.0"
	e.Start("checkout", src, map[string]any{"order": 7})
	require.Equal(t, jetflow.StatusFailed, e.Wait(src).Status)
	plan, err := e.Client.Rerun(ctxT(t, 10*time.Second), src, jetflow.RerunOptions{DryRun: true})
	require.NoError(t, err)
	rerunID := plan.RunID
	require.Equal(t, src+"-rerun-charge-0", rerunID)

	b.navigate(e.Srv.URL + "/ui/#/runs/" + src)
	b.waitFor("the actions", `document.querySelector("#rerun-run") !== null && document.querySelector("#start-again") !== null`)
	var classes []string
	b.eval(`[document.querySelector("#rerun-run").className, document.querySelector("#start-again").className]`, &classes)
	require.Equal(t, []string{"primary", "secondary"}, classes, "Rerun… is the primary action")
	var from []string
	b.eval(stepIDsJS("#timeline .rerun-from"), &from)
	require.Equal(t, []string{reserve, charge}, from, "Rerun from here… on each committed step")

	// Start again says plainly what it repeats.
	b.run("start again", chromedp.Click("#start-again", chromedp.ByQuery))
	b.waitFor("the dialog", `document.querySelector("#confirm").open`)
	require.Contains(t, b.text("#confirm-text"), "Every step runs again under new step IDs: charges, emails and other side effects repeat. To keep what succeeded, use Rerun.")
	b.run("Esc", chromedp.KeyEvent(kb.Escape))
	b.waitFor("the dialog closed", `!document.querySelector("#confirm").open`)
	e.RequireRun(src, jetflow.StatusFailed, 0, "Esc starts nothing")

	// The fix is deployed: the charge goes through now.
	co.declined.Store(false)

	// The plan, in the dialog, as the client plans it.
	b.run("rerun", chromedp.Click("#rerun-run", chromedp.ByQuery))
	b.waitFor("the plan", `document.querySelector("#confirm").open && document.querySelector("#rerun-kept") !== null`)
	require.Equal(t, "Rerun this run?", b.text("#confirm-title"))
	require.Equal(t, rerunID, b.text("#rerun-id"))
	text := b.text("#confirm-text")
	require.Contains(t, text, "A new run, "+rerunID+", of checkout starts")
	require.Contains(t, text, "before charge ("+charge+"), which never run again")
	require.Contains(t, text, "their side effects repeat")
	var kept, again []string
	b.eval(stepIDsJS("#rerun-kept li"), &kept)
	b.eval(stepIDsJS("#rerun-again li"), &again)
	require.Equal(t, stepIDs(plan.Kept), kept)
	require.Equal(t, stepIDs(plan.Again), again)
	require.Equal(t, []string{reserve}, kept)
	require.Equal(t, []string{charge}, again)
	require.Contains(t, b.text("#confirm-extra"), "Kept: never run again (1 step)")
	require.Contains(t, b.text("#confirm-extra"), "Run again under new step IDs: their side effects repeat (1 step)")
	require.Contains(t, b.text("#rerun-again li"), "failed", "the step the run failed at")
	var existing bool
	b.eval(`document.querySelector("#rerun-existing") !== null`, &existing)
	require.False(t, existing)
	b.viewScreenshot("inspector-rerun")
	b.run("Esc", chromedp.KeyEvent(kb.Escape))
	b.waitFor("the dialog closed", `!document.querySelector("#confirm").open`)
	_, err = e.Client.GetRun(ctxT(t, 10*time.Second), rerunID)
	require.ErrorIs(t, err, jetflow.ErrRunNotFound, "neither the plan nor Esc starts the rerun")

	// Confirmed: created, linked, listed by the source.
	b.run("rerun", chromedp.Click("#rerun-run", chromedp.ByQuery))
	b.waitFor("the plan", `document.querySelector("#confirm").open && document.querySelector("#rerun-kept") !== null`)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the rerun created and listed", `document.querySelector("#rerun-link")?.textContent === `+jsString(rerunID)+
		` && document.querySelector("#run-reruns a.rerun")?.textContent === `+jsString(rerunID))
	result := b.text("#action-result")
	require.True(t, strings.HasPrefix(result, "Rerun "+rerunID+" created ("), result)
	require.True(t, strings.HasSuffix(result, "): 1 step kept, 1 step run again."), result)
	var reruns []string
	b.eval(`[...document.querySelectorAll("#run-reruns a.rerun")].map(a => [a.getAttribute("href"), a.dataset.from]).flat()`, &reruns)
	require.Equal(t, []string{"#/runs/" + rerunID, charge}, reruns)

	run := e.Wait(rerunID)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, &jetflow.RerunOf{RunID: src, From: charge}, run.RerunOf)
	require.Equal(t, map[string]int{reserve: 1, charge: 1, rerunID + ".charge.0": 1, rerunID + ".ship.0": 1}, co.calls(),
		"the kept reserve never ran again; the charge ran again under the rerun's step ID")

	// The rerun's page: Rerun of, with the source and its from step.
	b.run("open the rerun", chromedp.Click("#rerun-link", chromedp.ByQuery))
	b.waitFor("the rerun, completed", `document.querySelector("#run-id")?.textContent === `+jsString(rerunID)+
		` && document.querySelector("#run-status")?.textContent === "completed" && document.querySelector("#run-rerun-of") !== null`)
	require.Equal(t, src+" from charge", b.text("#run-rerun-of"))
	var links []string
	b.eval(`[...document.querySelectorAll("#run-rerun-of a")].map(a => a.getAttribute("href"))`, &links)
	require.Equal(t, []string{"#/runs/" + src, "#/runs/" + src + "?step=" + charge}, links)
	steps, err := e.Client.Steps(ctxT(t, 10*time.Second), rerunID)
	require.NoError(t, err)
	var shown []string
	b.eval(`[...document.querySelectorAll("#timeline .step-id")].map(s => s.textContent)`, &shown)
	require.Equal(t, stepIDs(steps), shown)
	require.Equal(t, []string{rerunID + ".reserve.0", rerunID + ".charge.0", rerunID + ".ship.0"}, shown,
		"the kept step under the rerun's own step ID, then the steps run again")

	// The from step's link: the source's page, that step marked.
	b.run("follow the from step", chromedp.Click("#run-rerun-of a.rerun-of-step", chromedp.ByQuery))
	b.waitFor("the source, its from step marked", `document.querySelector("#run-id")?.textContent === `+jsString(src)+
		` && document.querySelector("#timeline .step.target")?.dataset.stepId === `+jsString(charge))
	var targets int
	b.eval(`document.querySelectorAll("#timeline .step.target").length`, &targets)
	require.Equal(t, 1, targets)

	// Rerun… again: the same run, existing, and nothing starts.
	b.waitFor("the rerun button", `document.querySelector("#rerun-run") !== null`)
	b.run("rerun again", chromedp.Click("#rerun-run", chromedp.ByQuery))
	b.waitFor("the plan, existing", `document.querySelector("#confirm").open && document.querySelector("#rerun-existing") !== null`)
	require.Equal(t, rerunID, b.text("#rerun-id"))
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the answer", `document.querySelector("#action-result")?.textContent.includes("exists already")`)
	require.Equal(t, "Rerun "+rerunID+" exists already (completed): nothing new started.", b.text("#action-result"))

	// Rerun from here… on the first step: nothing kept, both run again.
	fromReserve := src + "-rerun-reserve-0"
	b.run("rerun from the first step", chromedp.Click(`#timeline .rerun-from[data-step-id="`+reserve+`"]`, chromedp.ByQuery))
	b.waitFor("the plan", `document.querySelector("#confirm").open && document.querySelector("#rerun-id")?.textContent === `+jsString(fromReserve))
	require.Equal(t, "None: every step of this run runs again.", b.text("#rerun-kept"))
	b.eval(stepIDsJS("#rerun-again li"), &again)
	require.Equal(t, []string{reserve, charge}, again)
	b.run("confirm", chromedp.Click("#confirm-ok", chromedp.ByQuery))
	b.waitFor("the rerun created and listed", `document.querySelector("#rerun-link")?.textContent === `+jsString(fromReserve)+
		` && document.querySelectorAll("#run-reruns a.rerun").length === 2`)
	require.Equal(t, rerunID+", "+fromReserve, b.text("#run-reruns"))
	run = e.Wait(fromReserve)
	require.Equal(t, jetflow.StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, &jetflow.RerunOf{RunID: src, From: reserve}, run.RerunOf)
	require.Equal(t, 1, co.calls()[fromReserve+".reserve.0"], "the first step ran again")
	require.Equal(t, 1, co.calls()[reserve], "and never under the source's step ID")
}

func stepIDs(steps []jetflow.StepRecord) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.StepID
	}
	return out
}
