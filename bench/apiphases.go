package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// The api and gated phases run the end-to-end workload with every start
// call waiting for its run's result: jetflow through its public API
// (jetflow.Start, then Handle.Result), and the gated program, the correct
// minimal JetStream design (rawProgram with gatedDesign). Each also makes
// an operations pass: opsRuns runs again with the tap on, counting what
// the program sent by kind. The latency phase paces both programs at half
// the gated program's saturation rate and compares their start calls.

// withOps runs a throughput pass of the end-to-end workload with waits
// for results, then a tapped pass of opsRuns runs whose counts, per run,
// become the throughput pass's ops.
func withOps(ctx context.Context, e *env, cfg config, label string, pass func(e2eOpts) (*e2eStats, error)) (*e2eStats, error) {
	s, err := pass(passOpts(label, cfg, true))
	if err != nil {
		return s, err
	}
	tp, err := newTap(e)
	if err != nil {
		return s, err
	}
	defer tp.close()
	o := opsPass(label, cfg, true, tp)
	ops, err := pass(o)
	if err != nil {
		return s, fmt.Errorf("operations pass: %w", err)
	}
	s.ops = ops.ops.scale(float64(o.runs))
	return s, nil
}

// medianOps is the median of each operation count over the repetitions.
func medianOps(list []*e2eStats) opCounts {
	out := opCounts{}
	for _, s := range list {
		for k := range s.ops {
			xs := make([]float64, len(list))
			for i, x := range list {
				xs[i] = x.ops[k]
			}
			out[k] = median(xs)
		}
	}
	return out
}

// headlineRows are the main table's rows of the api phase next to the
// gated program (either may be nil: not run).
func headlineRows(a, g *e2eStats) []row {
	if a == nil {
		a = &e2eStats{}
	}
	if g == nil {
		g = &e2eStats{}
	}
	d := func(metric string, f func(*e2eStats) time.Duration) row {
		return row{metric, dur(f(a)), "gated program " + dur(f(g)), ratio(float64(f(a)), float64(f(g)))}
	}
	return []row{
		{"api runs/s (start + wait for result)", rate(a, a.runsPerSec), "gated program " + rate(g, g.runsPerSec), ratioFn(a, g, (*e2eStats).runsPerSec)},
		{"api steps/s", rate(a, a.stepsPerSec), "gated program " + rate(g, g.stepsPerSec), ratioFn(a, g, (*e2eStats).stepsPerSec)},
		d("api start call p50", func(s *e2eStats) time.Duration { return s.calls.p50 }),
		d("api start call p99", func(s *e2eStats) time.Duration { return s.calls.p99 }),
		d("api end to end p50 (start call->result)", func(s *e2eStats) time.Duration { return s.p50 }),
		d("api end to end p99", func(s *e2eStats) time.Duration { return s.p99 }),
		d("api CPU per run (server, client, worker)", func(s *e2eStats) time.Duration { return s.cpuPerRun }),
	}
}

// latencyFigures is one repetition of the latency phase.
type latencyFigures struct {
	// satGated, satAPI: start calls/s of each program unpaced (0 when
	// --start-rate was given); rate: the pace of the measured passes.
	satGated, satAPI, rate float64
	gated, api             *e2eStats
}

var latencyResults []latencyFigures

// callRate is the start calls per second a pass made, from its first
// start call to its last completion.
func callRate(s *e2eStats) float64 {
	return float64(s.created+s.duplicates) / s.elapsed.Seconds()
}

// latencyPhase measures each program's saturation rate (unless
// --start-rate gives the pace), then runs both paced at half the gated
// program's, without waiting for results, and keeps their start calls'
// latency.
func latencyPhase(ctx context.Context, e *env, cfg config, label string) (f latencyFigures, err error) {
	f.gated, f.api = &e2eStats{}, &e2eStats{}
	gated := func(o e2eOpts) (*e2eStats, error) { return rawProgram(ctx, e, cfg, gatedDesign, o) }
	api := func(o e2eOpts) (*e2eStats, error) { return engineE2E(ctx, e, cfg, o) }
	f.rate = cfg.startRate
	if f.rate == 0 {
		s, err := gated(passOpts(label+"-sat-gated", cfg, false))
		if err != nil {
			return f, fmt.Errorf("gated saturation: %w", err)
		}
		f.satGated = callRate(s)
		if s, err = api(passOpts(label+"-sat-api", cfg, false)); err != nil {
			return f, fmt.Errorf("jetflow saturation: %w", err)
		}
		f.satAPI = callRate(s)
		f.rate = f.satGated / 2
	}
	paced := func(name string) e2eOpts {
		o := passOpts(label+"-"+name, cfg, false)
		o.rate = f.rate
		return o
	}
	if f.gated, err = gated(paced("gated")); err != nil {
		return f, fmt.Errorf("gated paced: %w", err)
	}
	if f.api, err = api(paced("api")); err != nil {
		return f, fmt.Errorf("jetflow paced: %w", err)
	}
	return f, nil
}

// Targets of issue 16 for the latency phase.
const (
	latencyRatioTarget = 1.5
	dupP99Target       = 3 * time.Millisecond
)

// printIssue16Report prints the operations per run and per step of the
// api and gated phases, and the latency, waiters and backlog phases'
// figures.
func printIssue16Report(out io.Writer, r *results) {
	header := [4]string{"metric", "jetflow", "reference", "ratio"}
	if a, g := medianStats(r.apis), medianStats(r.gateds); a != nil && g != nil {
		fmt.Fprintf(out, "operations by kind (tap; %d runs of each, every start waiting for its result): jetflow api next to the gated program\n", min(r.cfg.runs, opsRuns))
		var rows [][4]string
		perStep := func(v float64) string { return dec2(v) + " (" + dec2(v/stepsPerRun) + ")" }
		for _, k := range opKinds([]shapeFigures{{opsShape: a.ops, opsRef: g.ops}}) {
			rows = append(rows, [4]string{k, perStep(a.ops[k]), "gated " + perStep(g.ops[k]), ratio(a.ops[k], g.ops[k])})
		}
		printTable(out, [4]string{"per run (per step)", "jetflow api", "reference", "ratio"}, rows)
		fmt.Fprintln(out)
	}
	if len(latencyResults) > 0 {
		pick := func(f func(latencyFigures) float64) float64 {
			xs := make([]float64, len(latencyResults))
			for i, x := range latencyResults {
				xs[i] = f(x)
			}
			return median(xs)
		}
		ms := func(f func(latencyFigures) time.Duration) time.Duration {
			return time.Duration(pick(func(x latencyFigures) float64 { return float64(f(x)) }))
		}
		ap50, ap99 := ms(func(x latencyFigures) time.Duration { return x.api.calls.p50 }), ms(func(x latencyFigures) time.Duration { return x.api.calls.p99 })
		gp50, gp99 := ms(func(x latencyFigures) time.Duration { return x.gated.calls.p50 }), ms(func(x latencyFigures) time.Duration { return x.gated.calls.p99 })
		adup, gdup := ms(func(x latencyFigures) time.Duration { return x.api.calls.dupP99 }), ms(func(x latencyFigures) time.Duration { return x.gated.calls.dupP99 })
		met := func(ok bool) string { return map[bool]string{true: "target met", false: "target missed"}[ok] }
		fmt.Fprintf(out, "latency at a fixed load: %s start calls/s (saturation: gated %s, jetflow %s calls/s), no waits for results\n",
			num(pick(func(x latencyFigures) float64 { return x.rate })), num(pick(func(x latencyFigures) float64 { return x.satGated })),
			num(pick(func(x latencyFigures) float64 { return x.satAPI })))
		printTable(out, header, [][4]string{
			{"start call p50", dur(ap50), "gated (KV create + publish) " + dur(gp50), ratio(float64(ap50), float64(gp50)) + " (" + met(float64(ap50) <= latencyRatioTarget*float64(gp50)) + ": <= 1.5)"},
			{"start call p99", dur(ap99), "gated (KV create + publish) " + dur(gp99), ratio(float64(ap99), float64(gp99)) + " (" + met(float64(ap99) <= latencyRatioTarget*float64(gp99)) + ": <= 1.5)"},
			{"duplicate start of an admitted run p99", dur(adup), "gated (KV create: ErrKeyExists) " + dur(gdup), ratio(float64(adup), float64(gdup)) + " (" + met(adup > 0 && adup < dupP99Target) + ": jetflow < 3ms)"},
		})
		if rate, sat := pick(func(x latencyFigures) float64 { return x.rate }), pick(func(x latencyFigures) float64 { return x.satAPI }); sat > 0 && rate > sat {
			fmt.Fprintln(out, "note: the pace is above jetflow's own saturation rate: its start calls queue behind the load.")
		}
		fmt.Fprintln(out)
	}
	printWaiterReport(out)
	printBacklogReport(out)
}
