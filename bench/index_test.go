package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// TestIndexPhaseRuns: the index phase runs at a small size — enough runs
// for the prefix page (order-1234...) and a deep page 20 — and its
// figures are sane: every page non-empty (the phase itself fails on a page
// holding a run its filter excludes, or on counts that do not add up to
// the runs written), the deep page is page 20, the counts are the plan's,
// and the report names each measurement.
func TestIndexPhaseRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const n = 1500
	cfg := config{repeat: 1, indexRuns: n, indexGoroutines: 8, indexSamples: 3, phases: map[string]bool{"index": true}}
	require.NoError(t, run(ctx, cfg))

	require.Len(t, indexResults, 1)
	f := indexResults[0]
	require.Equal(t, n, f.n)
	require.Zero(t, f.indexFailures)
	require.Positive(t, f.populate)
	require.Positive(t, f.rawCreate)
	require.Positive(t, f.rawRecords)
	require.EqualValues(t, n, f.indexMsgs, "one index entry a run")
	require.Equal(t, indexDeepPages, f.deepDepth)
	for _, g := range []directRefs{f.indexGets, f.plainGets} {
		require.Positive(t, g.single.p50)
		require.Positive(t, g.newest.p50)
		require.Positive(t, g.random.p50)
		require.Positive(t, g.unfiltered.p50)
	}

	plan := newIndexPlan(n)
	byName := map[string]pageFigure{}
	for _, p := range f.pages {
		require.Positive(t, p.runs, p.name)
		require.Positive(t, p.full.p50, p.name)
		require.LessOrEqual(t, p.full.p50, p.full.p99, p.name)
		byName[p.name] = p
	}
	require.Len(t, byName, 8)
	sum := func(workflow string) int {
		c := plan.counts(workflow)
		return int(c.Running + c.Completed + c.Failed + c.Cancelled)
	}
	require.Equal(t, n, byName["CountRuns (all workflows)"].runs)
	require.Equal(t, sum(indexWorkflow(0)), byName["CountRuns (workflow "+indexWorkflow(0)+")"].runs)
	require.Equal(t, indexPageSize, byName["newest first"].runs)
	prefixed := 0
	for i := range n {
		if strings.HasPrefix(indexRunID(i), indexPrefix) {
			prefixed++
		}
	}
	require.Equal(t, prefixed, byName["run ID prefix "+indexPrefix].runs)
	require.Equal(t, min(indexPageSize, sum(indexRare)), byName["workflow "+indexRare+" (1%)"].runs)

	var out bytes.Buffer
	printIndexReport(&out, &results{cfg: cfg})
	for _, want := range []string{"populate runs/s", "raw KV create/s", "raw batch direct get, 50 newest msgs, index stream", "from a random place", "without a subject filter", "plain stream", "newest first (50 runs)",
		"deep: page 20 of newest first", "CountRuns (all workflows)", "where newest first's time goes", "target"} {
		require.Contains(t, out.String(), want)
	}
}

// TestIndexPlan: the populate's mix is the issue's — 1% of one rare
// workflow, ~90/7/2/1% completed/failed/running/cancelled — and the same
// for the same size.
func TestIndexPlan(t *testing.T) {
	t.Parallel()
	const n = 100000
	p := newIndexPlan(n)
	c := p.counts("")
	share := func(v int64) float64 { return float64(v) / n }
	require.InDelta(t, 0.90, share(c.Completed), 0.01)
	require.InDelta(t, 0.07, share(c.Failed), 0.01)
	require.InDelta(t, 0.02, share(c.Running), 0.005)
	require.InDelta(t, 0.01, share(c.Cancelled), 0.005)
	rare := p.counts(indexRare)
	require.InDelta(t, 0.01, share(rare.Running+rare.Completed+rare.Failed+rare.Cancelled), 0.003)
	require.Equal(t, p, newIndexPlan(n))

	r := p.record(7, time.Unix(0, 0))
	require.Equal(t, "order-7", r.RunID)
	require.Equal(t, state.StatusRunning, r.Status)
	p.end(7, &r, time.Unix(1, 0))
	require.Equal(t, p.status[7], r.Status)
}

// TestLatencyOf: p50 and p99 are taken from the sorted samples.
func TestLatencyOf(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := latencyOf(ds)
	require.Equal(t, 51*time.Millisecond, l.p50)
	require.Equal(t, 100*time.Millisecond, l.p99)
}
