package inspector_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/inspectortest"
)

// attemptLabels are the timeline's attempt rows of stepID: number, label,
// and whether the row is marked failed.
func (b *browser) attemptLabels(stepID string) [][]string {
	b.t.Helper()
	var rows [][]string
	b.eval(`[...document.querySelectorAll('#timeline .attempt[data-step-id=`+jsString(stepID)+`]')].map(a =>
		[a.dataset.attempt, a.querySelector(".tl-label").textContent, String(a.classList.contains("attempt-failed"))])`, &rows)
	return rows
}

// Every attempt that failed is labelled "failed": those of a step that
// waits for its retry, and the last of a step that failed for good (its
// committed failure), which the page used to show without the word.
func TestBrowserFailedAttempts(t *testing.T) {
	t.Parallel()
	e := inspectortest.New(t)
	b := newBrowser(t)
	e.Start("stuck", "partner-4", map[string]any{"n": 4})
	e.Start("exhausts", "partner-5", map[string]any{"n": 5})
	require.Equal(t, jetflow.StatusFailed, e.Wait("partner-5").Status)
	var open []jetflow.OpenStep
	require.Eventually(t, func() bool {
		var err error
		open, err = e.Client.OpenSteps(ctxT(t, 10*time.Second), "partner-4")
		require.NoError(t, err)
		return len(open) == 1 && len(open[0].Attempts) == 1
	}, 30*time.Second, 20*time.Millisecond, "the failed first attempt is recorded")

	// A step waiting for its retry: its failed attempt, then the next.
	b.open(e.Srv.URL + "/ui/#/runs/partner-4")
	b.waitFor("the open step", `document.querySelector("#timeline .open-step .attempt") !== null`)
	rows := b.attemptLabels(open[0].StepID)
	require.Len(t, rows, 2, "%v", rows)
	require.Equal(t, "1", rows[0][0])
	require.True(t, strings.HasPrefix(rows[0][1], "attempt 1 · failed"), rows[0][1])
	require.Equal(t, "true", rows[0][2])
	require.Equal(t, "2", rows[1][0])
	require.True(t, strings.HasPrefix(rows[1][1], "attempt 2 · retry pending"), rows[1][1])
	require.Equal(t, "false", rows[1][2])

	// A step that failed on each of its attempts: each is failed, the
	// committed last one too.
	steps, err := e.Client.Steps(ctxT(t, 10*time.Second), "partner-5")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.NotEmpty(t, steps[0].Error)
	require.Equal(t, 2, steps[0].Attempt)
	b.open(e.Srv.URL + "/ui/#/runs/partner-5")
	b.waitFor("the failed step", `document.querySelector("#timeline .attempt") !== null`)
	rows = b.attemptLabels(steps[0].StepID)
	require.Len(t, rows, 2, "%v", rows)
	for i, r := range rows {
		require.Equal(t, []string{string(rune('1' + i)), "true"}, []string{r[0], r[2]}, "%v", r)
		require.Contains(t, r[1], " · failed", "attempt %s: %q", r[0], r[1])
	}
	require.Contains(t, b.text("#timeline"), "attempt 2: the partner API answers 503")
	require.Equal(t, "failed", b.text("#run-status"))
}
