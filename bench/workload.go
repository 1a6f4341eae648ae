package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// workload is the end-to-end start plan shared by the minimal JetStream
// program and the jetflow engine, so both do exactly the same starts in the
// same order.
type workload struct {
	ids   []string       // run IDs, index = run number
	index map[string]int // run ID -> run number
	jobs  []int          // start calls in order; a duplicated run appears twice
	dups  int            // number of duplicate start calls
}

// newWorkload plans runs distinct run IDs, of which round(runs*dupFrac) are
// started twice. Half of the duplicates follow their original immediately
// (with several starters pulling jobs in order they run concurrently with it),
// the other half lag = 4*starters start calls later (shortly after; the
// original has usually been admitted and may already be running).
func newWorkload(prefix string, runs int, dupFrac float64, starters int) *workload {
	w := &workload{ids: make([]string, runs), index: make(map[string]int, runs)}
	for i := range runs {
		id := fmt.Sprintf("%s-%d", prefix, i)
		w.ids[i] = id
		w.index[id] = i
	}
	dups := int(float64(runs)*dupFrac + 0.5)
	lag := 4 * starters
	type delayed struct{ at, run int }
	var later []delayed
	w.jobs = make([]int, 0, runs+dups)
	flush := func(all bool) {
		for len(later) > 0 && (all || later[0].at <= len(w.jobs)) {
			w.jobs = append(w.jobs, later[0].run)
			later = later[1:]
		}
	}
	for i := range runs {
		w.jobs = append(w.jobs, i)
		// Spread the duplicated runs evenly: run i is duplicated when the
		// running quota i*dups/runs steps up.
		if dups > 0 && (i+1)*dups/runs > i*dups/runs {
			if w.dups%2 == 0 {
				w.jobs = append(w.jobs, i)
			} else {
				later = append(later, delayed{at: len(w.jobs) + lag, run: i})
			}
			w.dups++
		}
		flush(false)
	}
	flush(true)
	return w
}

// tracker records, per run, when its first start call began and when it
// was seen completed.
type tracker struct {
	n         int
	start     []atomic.Int64 // unix ns of the first start call
	done      []atomic.Int64 // unix ns of completion (or failure)
	completed atomic.Int64
	failed    atomic.Int64
	allDone   chan struct{}
	closeOnce sync.Once
}

func newTracker(n int) *tracker {
	return &tracker{n: n, start: make([]atomic.Int64, n), done: make([]atomic.Int64, n), allDone: make(chan struct{})}
}

// started marks the beginning of a start call of run i (only the first counts).
func (t *tracker) started(i int) { t.start[i].CompareAndSwap(0, time.Now().UnixNano()) }

// finished records the end of run i; later reports (redeliveries, repeated
// watch updates) are ignored. It reports whether this was the first report.
func (t *tracker) finished(i int, ok bool) bool {
	if !t.done[i].CompareAndSwap(0, time.Now().UnixNano()) {
		return false
	}
	var total int64
	if ok {
		total = t.completed.Add(1) + t.failed.Load()
	} else {
		total = t.failed.Add(1) + t.completed.Load()
	}
	if total >= int64(t.n) {
		t.closeOnce.Do(func() { close(t.allDone) })
	}
	return true
}

// wait blocks until every run finished, ctx ends or timeout passes.
func (t *tracker) wait(ctx context.Context, timeout time.Duration) error {
	select {
	case <-t.allDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("timed out after %s: %d of %d runs completed, %d failed",
			timeout, t.completed.Load(), t.n, t.failed.Load())
	}
}

// e2eStats is what one end-to-end measurement produced.
type e2eStats struct {
	runs, steps   int
	elapsed       time.Duration // first start call to last completion
	completed     int64
	failed        int64
	p50, p99, max time.Duration
	created       int64 // start calls that created their run
	duplicates    int64 // start calls absorbed as duplicates
	msgsPerRun    float64
	writesPerRun  float64
	cpuPerRun     time.Duration // process CPU (server, client and worker) from the first start call to the last result, per run
	calls         callSummary   // start call latency
	ops           opCounts      // with a tap only: operations by kind over the pass
	extra         []string      // free-form lines for the report
	tracker       *tracker      // for --timeline
}

func (s *e2eStats) runsPerSec() float64  { return float64(s.runs) / s.elapsed.Seconds() }
func (s *e2eStats) stepsPerSec() float64 { return float64(s.steps) / s.elapsed.Seconds() }

// summarize computes throughput and latency from a finished tracker.
func (t *tracker) summarize(stepsPerRun int) *e2eStats {
	s := &e2eStats{completed: t.completed.Load(), failed: t.failed.Load()}
	var first, last int64
	lat := make([]time.Duration, 0, t.n)
	for i := range t.n {
		st, dn := t.start[i].Load(), t.done[i].Load()
		if st == 0 || dn == 0 {
			continue
		}
		if first == 0 || st < first {
			first = st
		}
		if dn > last {
			last = dn
		}
		lat = append(lat, time.Duration(dn-st))
	}
	// Throughput counts the runs that finished (all of them, unless the
	// phase failed).
	s.runs, s.steps = len(lat), len(lat)*stepsPerRun
	s.elapsed = time.Duration(last - first)
	if s.elapsed <= 0 {
		s.elapsed = time.Nanosecond
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		s.p50 = lat[len(lat)*50/100]
		s.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
		s.max = lat[len(lat)-1]
	}
	return s
}

// runStarters executes the workload's start calls with n goroutines, in
// order, marking each run's first start in the tracker. With rate > 0 the
// j-th call is not made before t0 + j/rate (an open-loop load as long as the
// system keeps up). It stops at the first error.
func runStarters(ctx context.Context, w *workload, t *tracker, n int, rate float64, start func(ctx context.Context, run int) error) error {
	t0 := time.Now()
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				j := int(next.Add(1) - 1)
				if j >= len(w.jobs) || ctx.Err() != nil {
					return
				}
				if rate > 0 {
					if d := time.Until(t0.Add(time.Duration(float64(j) / rate * float64(time.Second)))); d > 0 {
						select {
						case <-time.After(d):
						case <-ctx.Done():
							return
						}
					}
				}
				run := w.jobs[j]
				t.started(run)
				if err := start(ctx, run); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("start %s: %w", w.ids[run], err); cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// parallel runs fn(i) for i in [0, n) on g goroutines and returns the
// elapsed time and the first error.
func parallel(ctx context.Context, n, g int, fn func(ctx context.Context, i int) error) (time.Duration, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	t0 := time.Now()
	for range g {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0), firstErr
}
