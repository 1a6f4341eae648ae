package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain lets the bench test binary be the waits phases' worker process
// (it re-executes itself with waitsWorkerEnv set), as the bench binary is.
func TestMain(m *testing.M) {
	if child, code := waitsWorkerMain(); child {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestWaitPhasesRun: the sleepers, wakeups and events phases run at a
// small size against their raw references: every run reaches its sleep
// and the broker storage it adds is counted per stream, the worker
// process is measured idle and while the runs sleep, every wake-up comes
// after the common due time (never before) and every run completes, and
// the event outcomes are exactly the plan's (the phases fail otherwise).
func TestWaitPhasesRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cfg := config{
		starters: 4, concurrency: 8, repeat: 1, timeout: 2 * time.Minute, dupFrac: 0.25,
		sleepers: 200, sleep: time.Hour, wakeups: 100, events: 100, waitWindow: 500 * time.Millisecond,
		phases: map[string]bool{"sleepers": true, "wakeups": true, "events": true},
	}
	require.NoError(t, run(ctx, cfg))

	require.Len(t, sleepResults, 1)
	s := sleepResults[0]
	require.Equal(t, 200, s.n)
	// A sleeping run holds its wake-up timer, its run record and its
	// first step's record on the broker.
	for _, stream := range []string{"JETFLOW_TIMERS", "KV_jetflow_runs", "KV_jetflow_steps"} {
		require.Positive(t, s.added[stream], "%s: %v", stream, s.added)
	}
	require.Positive(t, s.raw.bytesPerMsg)
	require.Positive(t, s.raw.publishRate)
	require.Positive(t, s.idle.RSS)
	require.Positive(t, s.sleeping.RSS)
	require.LessOrEqual(t, s.sleeping.Goroutines-s.idle.Goroutines, goroutineSlack(s.n))
	require.Positive(t, s.toSleep)

	require.Len(t, wakeResults, 1)
	w := wakeResults[0]
	require.Equal(t, 100, w.engine.n)
	require.Zero(t, w.engine.early)
	require.Positive(t, w.engine.last)
	require.Equal(t, 100, w.raw.wake.n)
	require.Zero(t, w.raw.wake.early)

	require.Len(t, eventResults, 1)
	ev := eventResults[0]
	require.EqualValues(t, 100, ev.delivered)
	require.EqualValues(t, 25, ev.duplicate)
	require.Equal(t, 125, ev.sends)
	require.EqualValues(t, 100, ev.resumed.completed)
	require.Positive(t, ev.rawRate)

	var out bytes.Buffer
	printWaitsReport(&out, &results{cfg: cfg})
	for _, want := range []string{"broker bytes per sleeping run", "of which JETFLOW_TIMERS", "worker goroutines while sleeping",
		"wake-ups/s (due -> last run completed)", "lateness p99", "event sends/s", "outcomes delivered / duplicate"} {
		require.Contains(t, out.String(), want)
	}
}

// TestLateness: lateness is measured from the due time; a completion
// before it is counted as early (which fails the wakeups phase).
func TestLateness(t *testing.T) {
	t.Parallel()
	due := time.Unix(1000, 0)
	at := func(d time.Duration) int64 { return due.Add(d).UnixNano() }
	ws := lateness([]int64{at(30 * time.Millisecond), at(10 * time.Millisecond), at(-time.Millisecond), at(20 * time.Millisecond)}, due)
	require.Equal(t, 4, ws.n)
	require.Equal(t, 1, ws.early)
	require.Equal(t, 30*time.Millisecond, ws.max)
	require.Equal(t, 20*time.Millisecond, ws.p50)
	require.InDelta(t, 4/0.03, ws.rate(), 0.001)
}

// TestLineWriter: the worker process's log lines reach the counter one
// at a time, however the pipe splits them.
func TestLineWriter(t *testing.T) {
	t.Parallel()
	logs := &logCounter{}
	lw := &lineWriter{w: logs}
	_, err := lw.Write([]byte(`{"level":"warn","message":"a"}` + "\n" + `{"level":"warn","mess`))
	require.NoError(t, err)
	_, err = lw.Write([]byte(`age":"a"}` + "\n" + `{"level":"error","message":"b"}` + "\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"jetflow worker log: 1 x error: b", "jetflow worker log: 2 x warn: a"}, logs.summary())
}
