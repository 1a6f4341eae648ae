package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// e2eOpts says how one end-to-end pass runs: its run ID prefix, how many
// distinct runs, the starters' pace, whether each start call then waits
// for its run's result, and the tap that counts its operations (nil: none).
type e2eOpts struct {
	label       string
	runs        int
	rate        float64
	waitResults bool
	tap         *tap
}

// passOpts is the pass of the end-to-end workload the command line asks for.
func passOpts(label string, cfg config, waitResults bool) e2eOpts {
	return e2eOpts{label: label, runs: cfg.runs, rate: cfg.startRate, waitResults: waitResults}
}

// opsRuns is how many runs the operations (tap) pass of the api and gated
// phases makes.
const opsRuns = 100

// opsPass is the tapped pass of label: at most opsRuns runs, unpaced.
func opsPass(label string, cfg config, waitResults bool, tp *tap) e2eOpts {
	return e2eOpts{label: label + "-ops", runs: min(cfg.runs, opsRuns), waitResults: waitResults, tap: tp}
}

// resultWaiters demultiplexes one watcher's results to the calls waiting
// for them: the cheapest correct way to wait for many runs (one consumer
// per process, whatever the number of waits).
type resultWaiters struct {
	mu      sync.Mutex
	waiting map[string][]chan struct{}
}

func newResultWaiters() *resultWaiters {
	return &resultWaiters{waiting: map[string][]chan struct{}{}}
}

// add registers a wait for runID's result; the channel is closed when
// fire(runID) is called.
func (r *resultWaiters) add(runID string) <-chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiting[runID] = append(r.waiting[runID], ch)
	return ch
}

// fire ends every wait registered for runID.
func (r *resultWaiters) fire(runID string) {
	r.mu.Lock()
	chs := r.waiting[runID]
	delete(r.waiting, runID)
	r.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}

// awaitResult waits until result is closed, ctx ends or timeout passes.
func awaitResult(ctx context.Context, result <-chan struct{}, timeout time.Duration) error {
	select {
	case <-result:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("no result within %s", timeout)
	}
}

// callTimes records how long start calls took; apart, the duplicate
// starts of a run whose creating start had already returned (the answer
// to a start of an admitted run).
type callTimes struct {
	mu          sync.Mutex
	all, dupAdm []time.Duration
	admitted    []atomic.Bool
}

func newCallTimes(runs int) *callTimes { return &callTimes{admitted: make([]atomic.Bool, runs)} }

// callStart is one start call's beginning.
type callStart struct {
	at       time.Time
	admitted bool // the run's creating start had returned before this call began
}

// begin marks the beginning of a start call of run.
func (c *callTimes) begin(run int) callStart {
	return callStart{admitted: c.admitted[run].Load(), at: time.Now()}
}

// end records a start call of run that began at b; created says it
// created the run.
func (c *callTimes) end(run int, b callStart, created bool) {
	d := time.Since(b.at)
	if created {
		c.admitted[run].Store(true)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, d)
	if !created && b.admitted {
		c.dupAdm = append(c.dupAdm, d)
	}
}

// callSummary is the latency of start calls: all of them, and the
// duplicates of admitted runs.
type callSummary struct {
	n, dupN                  int
	p50, p99, dupP50, dupP99 time.Duration
}

func (c *callTimes) summary() callSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s callSummary
	s.n, s.p50, s.p99 = percentiles(c.all)
	s.dupN, s.dupP50, s.dupP99 = percentiles(c.dupAdm)
	return s
}

// percentiles sorts ds and returns its length, p50 and p99 (0 if empty).
func percentiles(ds []time.Duration) (n int, p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return len(ds), ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)]
}

// flushedOps is the tap's counts once the server has handled everything
// conns sent: once their flushes return, the tap sees all of it before
// its own marker.
func flushedOps(ctx context.Context, tp *tap, conns ...*nats.Conn) (opCounts, error) {
	for _, nc := range conns {
		if err := nc.Flush(); err != nil {
			return nil, err
		}
	}
	return tp.snapshot(ctx)
}
