package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// TestAttrsPhaseRuns: the attrs phase runs at a small size and its
// figures are sane: every page checked whole by the phase (each run
// matching its attributes and status), as many runs as the plan gives,
// two starts' costs, and a report naming each measurement.
func TestAttrsPhaseRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	const n = 2000
	cfg := config{repeat: 1, indexRuns: n, indexGoroutines: 8, indexSamples: 3, phases: map[string]bool{"attrs": true}}
	require.NoError(t, run(ctx, cfg))

	require.Len(t, attrResults, 1)
	f := attrResults[0]
	require.Equal(t, n, f.n)
	require.Positive(t, f.populate)
	require.Positive(t, f.plainStart)
	require.Positive(t, f.attrsStart)
	plan := newIndexPlan(n)
	count := func(keep func(i int) bool) int {
		k := 0
		for i := range n {
			if keep(i) {
				k++
			}
		}
		return min(k, indexPageSize)
	}
	want := map[string]int{
		"attribute customer=c-7 (0.1%)": count(func(i int) bool { return i%attrCustomers == 7 }),
		"attribute order_id=42 (5%)":    count(func(i int) bool { return i%attrShare == 0 }),
		"attribute order_id=42 and status failed": count(func(i int) bool {
			return i%attrShare == 0 && plan.status[i] == state.StatusFailed
		}),
		"attributes order_id=42 and customer=c-0": count(func(i int) bool { return i%attrCustomers == 0 }),
		"deep: page 2 of order_id=42":             n/attrShare - indexPageSize,
	}
	got := map[string]int{}
	for _, p := range f.pages {
		require.Positive(t, p.full.p50, p.name)
		got[p.name] = p.runs
	}
	require.Equal(t, want, got)

	var out bytes.Buffer
	printAttrsReport(&out)
	for _, name := range []string{"populate runs/s", "one start, mean ms", "attribute order_id=42 (5%)", "deep: page 2", "target"} {
		require.Contains(t, out.String(), name)
	}
}
