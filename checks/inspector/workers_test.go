package inspector_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// workerRowsJS is the workers table's rows: name, ID, what it serves.
const workerRowsJS = `[...document.querySelectorAll("#workers-body tr")].map(r => [r.querySelector(".w-name").textContent, r.querySelector(".w-id").textContent, r.querySelector(".w-serves").textContent])`

// workflowRowsJS is the workflows table's rows: name, served now by,
// first served by.
const workflowRowsJS = `[...document.querySelectorAll("#workflows-body tr")].map(r => [r.dataset.workflow, r.querySelector(".wf-workers").textContent, r.querySelector(".wf-first").textContent])`

// The workers view shows who serves what now, as Client.Roster reads it:
// each running worker with the workflows it serves, each known workflow
// with the workers serving it; a worker that stops is gone, and its
// workflow is shown served by no worker.
func TestBrowserWorkers(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("nightly-report", func(*jetflow.Context, map[string]any) (int, error) { return 1, nil })))
	reporter := e.Worker("reporter-1", ws)

	roster, err := e.Client.Roster(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Len(t, roster.Workers, 2)
	b.navigate(e.Srv.URL + "/ui/#/workers")
	b.waitFor("the two workers", `document.querySelectorAll("#workers-body tr").length === 2`)
	var rows [][]string
	b.eval(workerRowsJS, &rows)
	require.Len(t, rows, 2)
	for i, w := range roster.Workers {
		require.Equal(t, w.Name, rows[i][0])
		require.Equal(t, w.ID, rows[i][1])
	}
	require.Equal(t, e.WorkerName, rows[0][0], "by name")
	require.Contains(t, rows[0][2], "echo, exhausts, fails, flaky")
	require.Equal(t, "reporter-1", rows[1][0])
	require.Equal(t, "nightly-report", rows[1][2])
	requireOneTimeFormat(t, b)
	var wfs [][]string
	b.eval(workflowRowsJS, &wfs)
	require.Len(t, wfs, len(roster.Workflows))
	served := map[string][]string{}
	for _, r := range wfs {
		served[r[0]] = r
	}
	require.Equal(t, []string{"nightly-report", "reporter-1", "reporter-1"}, served["nightly-report"])
	require.Equal(t, []string{"echo", e.WorkerName, e.WorkerName}, served["echo"])
	// Each worker's build; the runs under way by build, counted when asked.
	var builds []string
	b.eval(`[...document.querySelectorAll("#workers-body .w-build")].map(c => c.textContent)`, &builds)
	require.Len(t, builds, 2)
	for i, w := range roster.Workers {
		want := w.Build
		if want == "" {
			want = "—"
		}
		require.Equal(t, want, builds[i], "a worker of this engine protocol shows its build alone")
	}
	e.Start("waiter", "engine-w-1", inspectortest.EchoIn{})
	require.Eventually(t, func() bool {
		st, err := e.Client.EngineStatus(ctxT(t, 10*time.Second))
		return err == nil && st.Builds["waiter"] != nil
	}, 10*time.Second, 20*time.Millisecond, "the parked run counted by build")
	b.run("count the runs by build", chromedp.Click("#engine-count", chromedp.ByQuery))
	b.waitFor("the runs by build", `document.querySelector('#engine-builds tr[data-workflow="waiter"]') !== null`)
	var count string
	b.eval(`document.querySelector('#engine-builds tr[data-workflow="waiter"] .num').textContent`, &count)
	require.Equal(t, "1", count)
	b.eval(`document.querySelector("#engine-foreign") === null ? "" : "foreign"`, &count)
	require.Empty(t, count, "no worker of another engine protocol")
	b.screenshot("inspector-workers")

	// The reporter stops: it is gone, its workflow served by nobody.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, reporter.Stop(ctx))
	b.waitFor("one worker", `document.querySelectorAll("#workers-body tr").length === 1`)
	b.waitFor("the report served by nobody", `document.querySelector('#workflows-body tr[data-workflow="nightly-report"] .no-worker') !== null`)

	// A workflow's name leads to its runs.
	b.run("open the runs of echo", chromedp.Click(`#workflows-body tr[data-workflow="echo"] .wf-name a`, chromedp.ByQuery))
	b.waitFor("the list of echo's runs", `location.hash.includes("workflow=echo") && document.querySelector("#runs") !== null`)
}
