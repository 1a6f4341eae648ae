package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// shapeFigures is one repetition of the fanout or the deep phase.
type shapeFigures struct {
	shape, ref passStats // throughput: the shape's runs, the 3-step runs
	// Operations per run, counted by the tap.
	opsShape, opsRef opCounts
	opsNarrow        opCounts // fanout only: width 1
	// deep only: median over runs of the time per step over the first and
	// the last deepWindow steps.
	early, late time.Duration
}

var fanoutResults, deepResults []shapeFigures

// Runs of each kind in the operations (tap) passes.
const (
	opsRefRuns    = 30
	opsFanoutRuns = 10
	opsDeepRuns   = 2
	deepWindow    = 50
)

// refRuns is how many 3-step runs make as many steps as runs runs of
// steps steps.
func refRuns(runs, steps int) int { return max(1, runs*steps/stepsPerRun) }

// engineFanout is one repetition of the fanout phase.
func engineFanout(ctx context.Context, e *env, cfg config, rep int) (f shapeFigures, err error) {
	p := "fan" + strconv.Itoa(rep)
	wide := fanoutShape(cfg.fanoutWidth)
	if f.shape, err = runPass(ctx, e, cfg, p+"-thr", wide, cfg.fanoutRuns, cfg.starters, nil); err != nil {
		return f, err
	}
	if f.ref, err = runPass(ctx, e, cfg, p+"-ref", e2eShape(), refRuns(cfg.fanoutRuns, wide.steps), cfg.starters, nil); err != nil {
		return f, err
	}
	tp, err := newTap(e)
	if err != nil {
		return f, err
	}
	defer tp.close()
	for _, x := range []struct {
		out  *opCounts
		sh   shape
		runs int
	}{{&f.opsRef, e2eShape(), opsRefRuns}, {&f.opsShape, wide, opsFanoutRuns}, {&f.opsNarrow, fanoutShape(1), opsFanoutRuns}} {
		ps, err := runPass(ctx, e, cfg, p+"-ops-"+x.sh.label, x.sh, x.runs, cfg.starters, tp)
		if err != nil {
			return f, err
		}
		*x.out = ps.ops.scale(float64(x.runs))
	}
	return f, nil
}

// engineDeep is one repetition of the deep phase.
func engineDeep(ctx context.Context, e *env, cfg config, rep int) (f shapeFigures, err error) {
	p := "deep" + strconv.Itoa(rep)
	deep := deepShape(cfg.deepSteps)
	// Every step body records when it first ran.
	times := make(map[string][]atomic.Int64, cfg.deepRuns)
	for i := range cfg.deepRuns {
		times[p+"-thr-"+strconv.Itoa(i)] = make([]atomic.Int64, cfg.deepSteps)
	}
	hook := func(runID string, i int) {
		if ts, ok := times[runID]; ok && i < len(ts) {
			ts[i].CompareAndSwap(0, time.Now().UnixNano())
		}
	}
	deepStepRan.Store(&hook)
	f.shape, err = runPass(ctx, e, cfg, p+"-thr", deep, cfg.deepRuns, min(cfg.starters, cfg.deepRuns), nil)
	deepStepRan.Store(nil)
	if err != nil {
		return f, err
	}
	f.early, f.late = stepWindows(times, min(deepWindow, cfg.deepSteps/2))
	if f.ref, err = runPass(ctx, e, cfg, p+"-ref", e2eShape(), refRuns(cfg.deepRuns, deep.steps), cfg.starters, nil); err != nil {
		return f, err
	}
	tp, err := newTap(e)
	if err != nil {
		return f, err
	}
	defer tp.close()
	ps, err := runPass(ctx, e, cfg, p+"-ops-ref", e2eShape(), opsRefRuns, cfg.starters, tp)
	if err != nil {
		return f, err
	}
	f.opsRef = ps.ops.scale(opsRefRuns)
	if ps, err = runPass(ctx, e, cfg, p+"-ops-deep", deep, opsDeepRuns, opsDeepRuns, tp); err != nil {
		return f, err
	}
	f.opsShape = ps.ops.scale(opsDeepRuns)
	return f, nil
}

// stepWindows returns the median over runs of the mean time per step over
// the first w steps and over the last w steps of each run.
func stepWindows(times map[string][]atomic.Int64, w int) (early, late time.Duration) {
	if w < 1 {
		return 0, 0
	}
	var es, ls []float64
	for _, ts := range times {
		n := len(ts)
		a, b, c, d := ts[0].Load(), ts[w].Load(), ts[n-1-w].Load(), ts[n-1].Load()
		if a == 0 || b == 0 || c == 0 || d == 0 {
			continue
		}
		es = append(es, float64(b-a)/float64(w))
		ls = append(ls, float64(d-c)/float64(w))
	}
	return time.Duration(median(es)), time.Duration(median(ls))
}

// medianOf is the median over the repetitions of f.
func medianOf(list []shapeFigures, f func(shapeFigures) float64) float64 {
	xs := make([]float64, len(list))
	for i, x := range list {
		xs[i] = f(x)
	}
	return median(xs)
}

// printTable prints rows of four columns under a header, aligned.
func printTable(out io.Writer, header [4]string, rows [][4]string) {
	w := [3]int{len(header[0]), len(header[1]), len(header[2])}
	for _, rw := range rows {
		w[0], w[1], w[2] = max(w[0], len(rw[0])), max(w[1], len(rw[1])), max(w[2], len(rw[2]))
	}
	line := func(r [4]string) {
		fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], r[0], w[1], r[1], w[2], r[2], r[3])
	}
	line(header)
	fmt.Fprintf(out, "%s-+-%s-+-%s-+-%s\n", strings.Repeat("-", w[0]), strings.Repeat("-", w[1]), strings.Repeat("-", w[2]), strings.Repeat("-", len(header[3])))
	for _, rw := range rows {
		line(rw)
	}
}

func micros(d float64) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(d/1e3, 'f', 0, 64) + "µs"
}

func dec2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// throughputRows compares the shape's throughput pass with the 3-step
// pass of the same phase and with the e2e phase of the same invocation.
func throughputRows(name string, list []shapeFigures, e2e *e2eStats) [][4]string {
	sps := medianOf(list, func(x shapeFigures) float64 { return x.shape.stepsPerSec() })
	rps := medianOf(list, func(x shapeFigures) float64 { return x.shape.runsPerSec() })
	refSps := medianOf(list, func(x shapeFigures) float64 { return x.ref.stepsPerSec() })
	refRps := medianOf(list, func(x shapeFigures) float64 { return x.ref.runsPerSec() })
	per := func(pick func(passStats) float64) (float64, float64) {
		return medianOf(list, func(x shapeFigures) float64 { return x.shape.perStep(pick(x.shape)) }),
			medianOf(list, func(x shapeFigures) float64 { return x.ref.perStep(pick(x.ref)) })
	}
	cpu, refCPU := per(func(p passStats) float64 { return float64(p.cpu) })
	msgs, refMsgs := per(func(p passStats) float64 { return float64(p.msgs) })
	writes, refWrites := per(func(p passStats) float64 { return float64(p.writes) })
	calls, refCalls := per(func(p passStats) float64 { return float64(p.bodyCalls) })
	ref := func(v string) string { return "3-step runs " + v }
	rows := [][4]string{
		{name + " steps/s", num(sps), ref(num(refSps)), ratio(sps, refSps)},
		{name + " runs/s", num(rps), ref(num(refRps)), "-"},
	}
	if e2e != nil && e2e.runs > 0 {
		rows = append(rows, [4]string{name + " steps/s", num(sps), "e2e phase " + num(e2e.stepsPerSec()), ratio(sps, e2e.stepsPerSec())})
	} else {
		rows = append(rows, [4]string{name + " steps/s", num(sps), "e2e phase (not run)", "-"})
	}
	rows = append(rows,
		[4]string{"CPU per step (whole process)", micros(cpu), ref(micros(refCPU)), ratio(cpu, refCPU)},
		[4]string{"Step/Go calls the body made per step (replays)", dec2(calls), ref(dec2(refCalls)), ratio(calls, refCalls)},
		[4]string{"client msgs sent per step", dec2(msgs), ref(dec2(refMsgs)), ratio(msgs, refMsgs)},
		[4]string{"stored writes per step (stream+KV)", dec2(writes), ref(dec2(refWrites)), ratio(writes, refWrites)},
	)
	return rows
}

// opRows compares operations per step of the shape with a 3-step run's.
func opRows(list []shapeFigures, shapeSteps int) [][4]string {
	var rows [][4]string
	for _, k := range opKinds(list) {
		v := medianOf(list, func(x shapeFigures) float64 { return x.opsShape[k] }) / float64(shapeSteps)
		r := medianOf(list, func(x shapeFigures) float64 { return x.opsRef[k] }) / stepsPerRun
		rows = append(rows, [4]string{k + " per step", dec2(v), "3-step run " + dec2(r), ratio(v, r)})
	}
	return rows
}

// opKinds lists the kinds counted in any repetition: the main ones first,
// then per bucket.
func opKinds(list []shapeFigures) []string {
	main := []string{opTask, opRead, opWrite, opAck, opPull, opAPI, opOther, opTotal, opDelivery}
	seen := map[string]bool{}
	for _, x := range list {
		for _, o := range []opCounts{x.opsShape, x.opsRef, x.opsNarrow} {
			for k := range o {
				seen[k] = true
			}
		}
	}
	var extra []string
	for k := range seen {
		if !slices.Contains(main, k) {
			extra = append(extra, k)
		}
	}
	slices.Sort(extra)
	var out []string
	for _, k := range append(main, extra...) {
		if seen[k] {
			out = append(out, k)
		}
	}
	return out
}

// printShapeReports prints the fanout and the deep phase's figures.
func printShapeReports(out io.Writer, r *results) {
	e2e := medianStats(r.engines)
	c := r.cfg
	header := [4]string{"metric", "jetflow", "reference", "ratio"}
	if len(fanoutResults) > 0 {
		w := c.fanoutWidth
		steps := w + 2
		fmt.Fprintf(out, "fanout: %s runs of 1 step -> %d parallel steps (Go + AwaitAll) -> 1 step (%d steps a run), %d starters, %s;\n",
			num(float64(c.fanoutRuns)), w, steps, c.starters, shapeWorkersText(c))
		fmt.Fprintf(out, "        reference: %s runs of the 3-step e2e workflow (as many steps) in the same phase; operations counted by a tap over %d fan-out runs (width %d and width 1) and %d 3-step runs\n",
			num(float64(refRuns(c.fanoutRuns, steps))), opsFanoutRuns, w, opsRefRuns)
		rows := throughputRows("fan-out", fanoutResults, e2e)
		rows = append(rows, opRows(fanoutResults, steps)...)
		if w > 1 {
			for _, k := range opKinds(fanoutResults) {
				v := medianOf(fanoutResults, func(x shapeFigures) float64 { return (x.opsShape[k] - x.opsNarrow[k]) / float64(w-1) })
				ref := medianOf(fanoutResults, func(x shapeFigures) float64 { return x.opsRef[k] }) / stepsPerRun
				rows = append(rows, [4]string{k + " per parallel branch", dec2(v), "per 3-step step " + dec2(ref), ratio(v, ref)})
			}
		}
		printTable(out, header, rows)
		printShapeRepetitions(out, "fan-out", fanoutResults)
		fmt.Fprintln(out)
	}
	if len(deepResults) > 0 {
		n := c.deepSteps
		fmt.Fprintf(out, "deep: %d runs of %d sequential steps, %s;\n", c.deepRuns, n, shapeWorkersText(c))
		fmt.Fprintf(out, "      reference: %s runs of the 3-step e2e workflow (as many steps) in the same phase; operations counted by a tap over %d deep runs and %d 3-step runs\n",
			num(float64(refRuns(c.deepRuns, n))), opsDeepRuns, opsRefRuns)
		rows := throughputRows("deep", deepResults, e2e)
		rows = append(rows, opRows(deepResults, n)...)
		if w := min(deepWindow, n/2); w > 0 {
			early := medianOf(deepResults, func(x shapeFigures) float64 { return float64(x.early) })
			late := medianOf(deepResults, func(x shapeFigures) float64 { return float64(x.late) })
			rows = append(rows, [4]string{fmt.Sprintf("time per step, last %d steps of a run", w), dur(time.Duration(late)),
				fmt.Sprintf("first %d steps %s", w, dur(time.Duration(early))), ratio(late, early)})
		}
		printTable(out, header, rows)
		printShapeRepetitions(out, "deep", deepResults)
		fmt.Fprintln(out)
	}
}

func shapeWorkersText(c config) string {
	return fmt.Sprintf("%d worker(s) of concurrency %d", c.shapeWorkers, c.concurrency)
}

func printShapeRepetitions(out io.Writer, name string, list []shapeFigures) {
	if len(list) > 1 {
		var a, b []string
		for _, x := range list {
			a = append(a, num(x.shape.stepsPerSec()))
			b = append(b, num(x.ref.stepsPerSec()))
		}
		fmt.Fprintf(out, "per repetition: %s steps/s %s; 3-step runs steps/s %s\n", name, strings.Join(a, " / "), strings.Join(b, " / "))
	}
	for i, x := range list {
		for _, l := range slices.Concat(x.shape.logs, x.ref.logs) {
			if !strings.Contains(l, "no retries") {
				fmt.Fprintf(out, "%s #%d: %s\n", name, i+1, l)
			}
		}
	}
}
