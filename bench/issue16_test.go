package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// testEnv is an env on a test server of its own; its connections are
// closed when the test ends.
func testEnv(t *testing.T) *env {
	e := &env{srv: testenv.Server(t)}
	t.Cleanup(func() {
		for _, nc := range e.conns {
			nc.Close()
		}
	})
	return e
}

// phaseTest marks t parallel and returns its context, bounded to the
// phases' timeout.
func phaseTest(t *testing.T) context.Context {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestGatedAndAPIPhasesRun: the gated program and jetflow's public API run
// the end-to-end workload with every start call (duplicates included)
// waiting for its run's result; the phases fail unless every run
// completed with its output and the starts' outcomes are the plan's. The
// tap counts each program's operations per run, and the report shows the
// api / gated headline and the operations table.
func TestGatedAndAPIPhasesRun(t *testing.T) {
	ctx := phaseTest(t)
	cfg := config{
		runs: 40, dupFrac: 0.25, starters: 4, concurrency: 8, repeat: 1, timeout: 2 * time.Minute,
		phases: map[string]bool{"gated": true, "api": true},
	}
	res := &results{cfg: cfg}
	e := testEnv(t)
	for _, x := range []struct {
		name string
		list *[]*e2eStats
		pass func(o e2eOpts) (*e2eStats, error)
	}{
		{"gated", &res.gateds, func(o e2eOpts) (*e2eStats, error) { return rawProgram(ctx, e, cfg, gatedDesign, o) }},
		{"api", &res.apis, func(o e2eOpts) (*e2eStats, error) { return engineE2E(ctx, e, cfg, o) }},
	} {
		s, err := withOps(ctx, e, cfg, x.name, x.pass)
		require.NoError(t, err)
		require.EqualValues(t, 40, s.completed)
		require.EqualValues(t, 10, s.duplicates)
		require.Equal(t, 50, s.calls.n, "every start call is timed")
		require.Positive(t, s.calls.p99)
		// Three steps: three step keys written per run, and at least
		// one task published and acked (jetflow runs a run's sequential
		// steps in one task; the gated program has a task per step).
		require.GreaterOrEqual(t, s.ops[opAck], 1.0, "%v", s.ops)
		require.GreaterOrEqual(t, s.ops[opWrite], 3.0, "%v", s.ops)
		require.GreaterOrEqual(t, s.ops[opTask], 1.0, "%v", s.ops)
		*x.list = append(*x.list, s)
	}
	// The gated program publishes exactly one task per step: a duplicate
	// start publishes nothing, and no task is redelivered here.
	require.Equal(t, 3.0, res.gateds[0].ops[opTask], "%v", res.gateds[0].ops)
	// It reads each step key once before writing it, and a duplicate
	// start reads its run's result key once (10 of 40 runs).
	require.InDelta(t, 3.25, res.gateds[0].ops[opRead+" bench_gated_steps"], 1e-9, "%v", res.gateds[0].ops)

	var out bytes.Buffer
	printReport(&out, res)
	printIssue16Report(&out, res)
	for _, want := range []string{"api runs/s (start + wait for result)", "api start call p99", "api end to end p99", "gated program",
		"per run (per step)", "task publish", "kv read jetflow_runs"} {
		require.Contains(t, out.String(), want)
	}
}

// TestLatencyWaitersBacklogPhasesRun: the latency phase measures both
// programs' saturation and their start calls paced at half the gated
// rate, duplicates of admitted runs included; the waiters phase's waits
// all return their completed run and the consumer counts are read; the
// backlog phase's worker process drains every run (each is checked).
func TestLatencyWaitersBacklogPhasesRun(t *testing.T) {
	ctx := phaseTest(t)
	cfg := config{
		runs: 200, dupFrac: 0.25, starters: 4, concurrency: 8, repeat: 1, timeout: 2 * time.Minute,
		waiters: 50, backlog: 200, waitWindow: 500 * time.Millisecond,
		phases: map[string]bool{"latency": true, "waiters": true, "backlog": true},
	}
	// Only this test appends to these results; with -count they grow
	// by one each time.
	nl, nw, nb := len(latencyResults), len(waiterResults), len(backlogResults)
	require.NoError(t, run(ctx, cfg))

	require.Len(t, latencyResults, nl+1)
	l := latencyResults[nl]
	require.Positive(t, l.satGated)
	require.Positive(t, l.satAPI)
	require.InDelta(t, l.satGated/2, l.rate, 1e-9)
	for _, s := range []*e2eStats{l.gated, l.api} {
		require.EqualValues(t, 200, s.completed)
		require.Equal(t, 250, s.calls.n)
		require.Positive(t, s.calls.p50)
		require.Positive(t, s.calls.dupN, "the lagged duplicates come after their run was admitted")
		require.Positive(t, s.calls.dupP99)
	}

	require.Len(t, waiterResults, nw+1)
	w := waiterResults[nw]
	require.Equal(t, 50, w.n)
	require.GreaterOrEqual(t, w.one, w.base)
	require.GreaterOrEqual(t, w.acctMany, w.many)
	require.Positive(t, w.rate())

	require.Len(t, backlogResults, nb+1)
	b := backlogResults[nb]
	require.Equal(t, 200, b.n)
	require.Positive(t, b.rate())
	require.GreaterOrEqual(t, b.peakRSS, b.rss)
	require.Positive(t, b.heap)

	var out bytes.Buffer
	printIssue16Report(&out, &results{cfg: cfg})
	for _, want := range []string{"start call p99", "duplicate start of an admitted run p99", "consumers on KV_jetflow_runs",
		"waits completed/s", "drain runs/s", "worker peak RSS"} {
		require.Contains(t, out.String(), want)
	}
}

// TestCallTimesDuplicateOfAdmittedRun: a duplicate start counts as the
// answer to a start of an admitted run only when the run's creating start
// had returned before it began; every call counts in the start latency.
func TestCallTimesDuplicateOfAdmittedRun(t *testing.T) {
	t.Parallel()
	c := newCallTimes(2)
	early := c.begin(0) // a duplicate racing the creating start
	created := c.begin(0)
	c.end(0, created, true)
	c.end(0, early, false)
	late := c.begin(0) // after the run was admitted
	c.end(0, late, false)
	c.end(1, c.begin(1), false) // run 1 never created here
	s := c.summary()
	require.Equal(t, 4, s.n)
	require.Equal(t, 1, s.dupN)
	require.Positive(t, s.dupP99)
}

// TestResultWaitersFireEveryWaitOfARun: one result ends every wait
// registered for its run, and no other run's.
func TestResultWaitersFireEveryWaitOfARun(t *testing.T) {
	t.Parallel()
	r := newResultWaiters()
	a1, a2, b := r.add("a"), r.add("a"), r.add("b")
	r.fire("a")
	require.NoError(t, awaitResult(t.Context(), a1, time.Minute))
	require.NoError(t, awaitResult(t.Context(), a2, time.Minute))
	select {
	case <-b:
		t.Fatal("run b's wait ended by run a's result")
	default:
	}
	r.fire("a") // a result seen again: nothing left to end
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, awaitResult(ctx, b, time.Minute), context.Canceled)
}
