package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// results collects every figure of one run; zero means "not measured".
type results struct {
	cfg           config
	serverVersion string
	dataDir       string

	// One entry per repetition.
	pubRates      []float64 // raw async publish, msgs/s
	kvRates       []float64 // raw KV create from cfg.kvG goroutines, creates/s
	admitDistinct []float64 // jetflow.Start, distinct IDs/s
	admitDup      []float64 // jetflow.Start, duplicate starts/s
	minis         []*e2eStats
	engines       []*e2eStats
	gateds        []*e2eStats // the gated program, each start waiting for its result
	apis          []*e2eStats // jetflow through the public API, each start waiting for its result
}

// median of xs; 0 when empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	ys := slices.Clone(xs)
	slices.Sort(ys)
	if len(ys)%2 == 1 {
		return ys[len(ys)/2]
	}
	return (ys[len(ys)/2-1] + ys[len(ys)/2]) / 2
}

// medianStats folds repetitions into one: the median of every figure.
func medianStats(list []*e2eStats) *e2eStats {
	if len(list) == 0 {
		return nil
	}
	if len(list) == 1 {
		return list[0]
	}
	pick := func(f func(*e2eStats) float64) float64 {
		xs := make([]float64, len(list))
		for i, s := range list {
			xs[i] = f(s)
		}
		return median(xs)
	}
	d := func(f func(*e2eStats) time.Duration) time.Duration {
		return time.Duration(pick(func(s *e2eStats) float64 { return float64(f(s)) }))
	}
	m := &e2eStats{runs: list[0].runs, steps: list[0].runs * stepsPerRun}
	// elapsed is chosen so that runs/s is the median runs/s.
	if rps := pick((*e2eStats).runsPerSec); rps > 0 {
		m.elapsed = time.Duration(float64(m.runs) / rps * float64(time.Second))
	} else {
		m.runs, m.steps = 0, 0
	}
	m.p50 = d(func(s *e2eStats) time.Duration { return s.p50 })
	m.p99 = d(func(s *e2eStats) time.Duration { return s.p99 })
	m.max = d(func(s *e2eStats) time.Duration { return s.max })
	m.cpuPerRun = d(func(s *e2eStats) time.Duration { return s.cpuPerRun })
	m.msgsPerRun = pick(func(s *e2eStats) float64 { return s.msgsPerRun })
	m.writesPerRun = pick(func(s *e2eStats) float64 { return s.writesPerRun })
	m.calls = callSummary{
		n: list[0].calls.n, dupN: list[0].calls.dupN,
		p50: d(func(s *e2eStats) time.Duration { return s.calls.p50 }), p99: d(func(s *e2eStats) time.Duration { return s.calls.p99 }),
		dupP50: d(func(s *e2eStats) time.Duration { return s.calls.dupP50 }), dupP99: d(func(s *e2eStats) time.Duration { return s.calls.dupP99 }),
	}
	m.ops = medianOps(list)
	return m
}

func printHeader(r *results) {
	c := r.cfg
	fmt.Printf("machine:   %s\n", machine())
	fmt.Printf("server:    embedded nats-server %s, file storage, SyncAlways=%t, loopback TCP, data in %s\n",
		r.serverVersion, c.syncAlways, r.dataDir)
	pace := "unpaced (saturating)"
	if c.startRate > 0 {
		pace = "paced at " + num(c.startRate) + " start calls/s"
	}
	fmt.Printf("workload:  e2e %s runs x %d steps, %.0f%% started twice, %d starters %s, worker concurrency %d;\n",
		num(float64(c.runs)), stepsPerRun, 100*c.dupFrac, c.starters, pace, c.concurrency)
	fmt.Printf("           admission %s IDs x %d goroutines; raw publish %s msgs; raw KV create %s keys x %d goroutines%s\n",
		num(float64(c.admitN)), c.admitG, num(float64(c.pubN)), num(float64(c.kvN)), c.kvG, map[bool]string{true: " (--quick)"}[c.quick])
	fmt.Println()
	_ = os.Stdout.Sync()
}

type row struct{ metric, value, ref, ratio string }

func printReport(out io.Writer, r *results) {
	c := r.cfg
	pub, kv, ad, dup := median(r.pubRates), median(r.kvRates), median(r.admitDistinct), median(r.admitDup)
	kvRef := "raw KV create " + strconv.Itoa(c.kvG) + "g " + num(kv)
	var rows []row
	if a, g := medianStats(r.apis), medianStats(r.gateds); a != nil || g != nil {
		rows = append(rows, headlineRows(a, g)...) // issue 16's headline: first
	}
	if pub+kv+ad+dup > 0 {
		rows = append(rows,
			row{"raw async publish msgs/s (Nats-Msg-Id)", "-", num(pub), "-"},
			row{"raw KV create/s, " + strconv.Itoa(c.kvG) + " goroutines", "-", num(kv), "-"},
			row{"admission distinct starts/s", num(ad), kvRef, ratio(ad, kv)},
			row{"admission duplicate starts/s (fingerprint + audit)", num(dup), kvRef, ratio(dup, kv)},
		)
	}
	e, m := medianStats(r.engines), medianStats(r.minis)
	if e == nil {
		e = &e2eStats{}
	}
	if m == nil {
		m = &e2eStats{}
	}
	if len(r.engines)+len(r.minis) > 0 {
		rows = append(rows, e2eRows(e, m)...)
	}
	w := [3]int{len("metric"), len("jetflow"), len("raw reference")}
	for _, rw := range rows {
		w[0], w[1], w[2] = max(w[0], len(rw.metric)), max(w[1], len(rw.value)), max(w[2], len(rw.ref))
	}
	line := func(a, b, c, d string) {
		fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], a, w[1], b, w[2], c, d)
	}
	if c.repeat > 1 {
		fmt.Fprintf(out, "figures are medians of %d repetitions\n", c.repeat)
	}
	line("metric", "jetflow", "raw reference", "ratio (jetflow/raw)")
	fmt.Fprintf(out, "%s-+-%s-+-%s-+-%s\n", strings.Repeat("-", w[0]), strings.Repeat("-", w[1]), strings.Repeat("-", w[2]), strings.Repeat("-", 19))
	for _, rw := range rows {
		line(rw.metric, rw.value, rw.ref, rw.ratio)
	}
	fmt.Fprintln(out)
	if c.repeat > 1 {
		all := func(name string, xs []float64) {
			if len(xs) == 0 {
				return
			}
			parts := make([]string, len(xs))
			for i, x := range xs {
				parts[i] = num(x)
			}
			fmt.Fprintf(out, "per repetition: %-28s %s\n", name, strings.Join(parts, " / "))
		}
		rps := func(list []*e2eStats) []float64 {
			xs := make([]float64, len(list))
			for i, s := range list {
				xs[i] = s.runsPerSec()
			}
			return xs
		}
		all("raw async publish msgs/s", r.pubRates)
		all("raw KV create/s", r.kvRates)
		all("admission distinct starts/s", r.admitDistinct)
		all("admission duplicate starts/s", r.admitDup)
		all("minimal program runs/s", rps(r.minis))
		all("jetflow e2e runs/s", rps(r.engines))
		all("gated program runs/s", rps(r.gateds))
		all("jetflow api runs/s", rps(r.apis))
		fmt.Fprintln(out)
	}
	for _, s := range []struct {
		name string
		list []*e2eStats
	}{{"minimal program", r.minis}, {"jetflow", r.engines}, {"gated program", r.gateds}, {"jetflow api", r.apis}} {
		for i, st := range s.list {
			label := s.name
			if len(s.list) > 1 {
				label = fmt.Sprintf("%s #%d", s.name, i+1)
			}
			fmt.Fprintf(out, "%s: %d/%d runs completed, %d failed; %d starts created a run, %d absorbed as duplicates\n",
				label, st.completed, st.tracker.n, st.failed, st.created, st.duplicates)
			for _, x := range st.extra {
				fmt.Fprintln(out, "  "+x)
			}
		}
	}
	if c.startRate == 0 && (len(r.engines) > 0 || len(r.minis) > 0) {
		fmt.Fprintln(out, "note: unpaced starts saturate the system, so e2e latency is mostly time queued behind the backlog; use --start-rate for latency at a fixed load.")
	}
	if c.timeline {
		for i := range c.repeat {
			if i < len(r.minis) && r.minis[i].tracker != nil {
				printTimeline(out, fmt.Sprintf("minimal program #%d", i+1), r.minis[i].tracker)
			}
			if i < len(r.engines) && r.engines[i].tracker != nil {
				printTimeline(out, fmt.Sprintf("jetflow #%d", i+1), r.engines[i].tracker)
			}
		}
	}
}

// e2eRows are the main table's rows of the e2e phase next to the minimal
// program.
func e2eRows(e, m *e2eStats) []row {
	return []row{
		{"e2e runs/s", rate(e, e.runsPerSec), "minimal program " + rate(m, m.runsPerSec), ratioFn(e, m, (*e2eStats).runsPerSec)},
		{"e2e steps/s", rate(e, e.stepsPerSec), "minimal program " + rate(m, m.stepsPerSec), ratioFn(e, m, (*e2eStats).stepsPerSec)},
		{"e2e latency p50 (first start->done)", dur(e.p50), "minimal program " + dur(m.p50), ratio(float64(e.p50), float64(m.p50))},
		{"e2e latency p99", dur(e.p99), "minimal program " + dur(m.p99), ratio(float64(e.p99), float64(m.p99))},
		{"e2e latency max", dur(e.max), "minimal program " + dur(m.max), ratio(float64(e.max), float64(m.max))},
		{"e2e wall time (first start->last done)", dur(e.elapsed), "minimal program " + dur(m.elapsed), ratio(float64(e.elapsed), float64(m.elapsed))},
		{"client msgs sent per run", dec(e.msgsPerRun), "minimal program " + dec(m.msgsPerRun), ratio(e.msgsPerRun, m.msgsPerRun)},
		{"stored writes per run (stream+KV)", dec(e.writesPerRun), "minimal program " + dec(m.writesPerRun), ratio(e.writesPerRun, m.writesPerRun)},
	}
}

// printTimeline prints how many runs had their first start call, and how
// many completed, in each 250ms slice since the first start.
func printTimeline(out io.Writer, name string, t *tracker) {
	const slice = int64(250 * time.Millisecond)
	var first int64
	for i := range t.n {
		if st := t.start[i].Load(); st != 0 && (first == 0 || st < first) {
			first = st
		}
	}
	starts, dones := map[int64]int{}, map[int64]int{}
	var last int64
	for i := range t.n {
		if st := t.start[i].Load(); st != 0 {
			starts[(st-first)/slice]++
		}
		if dn := t.done[i].Load(); dn != 0 {
			k := (dn - first) / slice
			dones[k]++
			last = max(last, k)
		}
	}
	fmt.Fprintf(out, "\ntimeline %s (per 250ms): runs started, runs completed\n", name)
	for k := int64(0); k <= last; k++ {
		fmt.Fprintf(out, "  %6.2fs %6d %6d\n", float64(k*slice)/1e9, starts[k], dones[k])
	}
}

func rate(s *e2eStats, f func() float64) string {
	if s.runs == 0 {
		return "-"
	}
	return num(f())
}

func ratioFn(a, b *e2eStats, f func(*e2eStats) float64) string {
	if a.runs == 0 || b.runs == 0 {
		return "-"
	}
	return ratio(f(a), f(b))
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

func dec(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	}
}

// num formats a rate or count with thousands separators; 0 is "-".
func num(v float64) string {
	if v == 0 {
		return "-"
	}
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}
