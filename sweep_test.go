package jetflow

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/sweep"
)

// passLog keeps the sweep passes a worker reports.
type passLog struct {
	mu     sync.Mutex
	passes []sweep.Pass
}

func (l *passLog) add(p sweep.Pass) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.passes = append(l.passes, p)
}

// count returns how many passes list runID in the field get selects.
func (l *passLog) count(runID string, get func(sweep.Pass) []string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.passes {
		if slices.Contains(get(p), runID) {
			n++
		}
	}
	return n
}

// errors counts the passes that met an error.
func (l *passLog) errors() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.passes {
		if p.Err != nil {
			n++
		}
	}
	return n
}

func checked(p sweep.Pass) []string { return p.Checked }

func touched(p sweep.Pass) []string {
	return slices.Concat(p.Suspected, p.Redispatched, p.Absorbed)
}

// TestSweeperResumesARunThatLostItsTask builds the state the sweeper is
// there for — running runs with no task left, as if their next task had
// been removed from JETFLOW_TASKS: one whose first step is committed, one
// whose steps are all committed, one with none, and a later generation's —
// next to a healthy run whose long second step is running. The worker's
// sweeper dispatches the stuck runs' start tasks again: they complete,
// their committed steps do not run again, the others run once, and the
// metric counts four stuck runs. The healthy run, checked at least twice,
// is never suspected. With the sweeper disabled (SweepInterval < 0) no
// stuck run completes.
func TestSweeperResumesARunThatLostItsTask(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	ctx := ctxT(t, 30*time.Second)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)

	// The stuck run: created an hour ago, step a committed by a worker that
	// is gone, no task anywhere.
	assets, err := jetstream.Provision(ctx, env.conn(), env.topo, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	writeStuckRun(t, assets, "swept", "swept-1", 0, `5`, `6`)
	// Every step committed, the run's end not recorded; and a third
	// generation (identity swept-3/3) stuck after its first step.
	writeStuckRun(t, assets, "swept", "swept-2", 0, `1`, `2`, `3`, `4`)
	writeStuckRun(t, assets, "swept", "swept-3", 3, `10`, `11`)
	// Nothing committed: the start task itself runs the first step.
	writeStuckRun(t, assets, "swept", "swept-4", 0, `20`)

	effects := newCounter()
	swept := threeSteps("swept", effects)
	release := make(chan struct{})
	slow := NewWorkflow("sweep_slow", func(ctx *Context, in int) (int, error) {
		a, err := Step(ctx, "a", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return in + 1, nil
		})
		if err != nil {
			return 0, err
		}
		return Step(ctx, "b", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			select { // runs for several StuckAfters, heartbeated
			case <-release:
			case <-sctx.Done():
				return 0, sctx.Err()
			}
			return a + 1, nil
		})
	})

	passes := &passLog{}
	// StuckAfter is the least allowed (3 × AckWait); AckWait is long enough
	// that a loaded machine does not miss heartbeats of the long step.
	env.worker(WorkerConfig{
		AckWait: 500 * time.Millisecond, SweepInterval: 20 * time.Millisecond, StuckAfter: 1500 * time.Millisecond,
		Metrics: m, sweepHook: passes.add,
	}, swept, slow)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the worker's stop, if the test fails early
	c := env.client()

	h, err := Start(ctx, c, slow, 1, WithRunID("slow-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("slow-1.b.0") == 1 }, 10*time.Second, 5*time.Millisecond)

	out, err := (&Handle[int]{RunID: "swept-1", client: c}).Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, out, "a's committed 6, then b and c")
	require.Equal(t, 0, effects.get("swept-1.a.0"), "the committed step did not run again")
	require.Equal(t, 1, effects.get("swept-1.b.0"))
	require.Equal(t, 1, effects.get("swept-1.c.0"))
	for id, want := range map[string]int{"swept-2": 4, "swept-3": 13, "swept-4": 23} {
		run, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		// The handle of the generation the run was seeded as.
		out, err := (&Handle[int]{RunID: id, client: c, Generation: run.Generation}).Result(ctx)
		require.NoError(t, err)
		require.Equal(t, want, out, id)
	}

	// The healthy run gets old enough to be checked, twice, and is left
	// alone: its step task is pending (delivered and heartbeated).
	require.Eventually(t, func() bool { return passes.count("slow-1", checked) >= 2 }, 10*time.Second, 5*time.Millisecond)
	require.Zero(t, passes.count("slow-1", touched), "the healthy run was suspected or dispatched again")
	unblock()
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, got)
	require.Equal(t, map[string]int{
		"slow-1.a.0": 1, "slow-1.b.0": 1,
		"swept-1.b.0": 1, "swept-1.c.0": 1, // swept-1.a.0 was committed
		"swept-3/3.b.0": 1, "swept-3/3.c.0": 1, // swept-2's steps were all committed
		"swept-4.a.0": 1, "swept-4.b.0": 1, "swept-4.c.0": 1,
	}, effects.snapshot())

	for _, id := range []string{"swept-1", "swept-2", "swept-3", "swept-4"} {
		require.Equal(t, 1, passes.count(id, func(p sweep.Pass) []string { return p.Redispatched }), id)
	}
	fams, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != metrics.NameRunsStuck {
			continue
		}
		for _, s := range f.GetMetric() {
			byName[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
	}
	// Every served workflow's series exists from the start, at 0.
	require.Equal(t, map[string]float64{"swept": 4, "sweep_slow": 0}, byName, "four stuck runs, of workflow swept")
}

// writeStuckRun writes, as a crash and a lost message would leave them, the
// record of generation gen of a run of wf created an hour ago and still
// running, and the committed results of its first steps (step names a, b,
// c..., outputs as given), with no task anywhere.
func writeStuckRun(t *testing.T, assets *jetstream.Assets, wf, runID string, gen int, input string, outputs ...string) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	fp, err := dedupe.Fingerprint(wf, json.RawMessage(input))
	require.NoError(t, err)
	created := time.Now().UTC().Add(-time.Hour)
	rec, err := state.Encode(state.Run{
		V: state.Version, RunID: runID, Workflow: wf, Input: json.RawMessage(input), Status: state.StatusRunning,
		Token: "token-" + runID, Fingerprint: fp, Generation: gen, CreatedAt: created, UpdatedAt: created,
		Exec: state.ExecLease,
	})
	require.NoError(t, err)
	_, err = assets.Runs.Create(ctx, runID, rec)
	require.NoError(t, err)
	for i, out := range outputs {
		name := string(rune('a' + i))
		id := state.StepID(state.RunIdentity(runID, gen), name, 0)
		step, err := state.Encode(state.Step{
			V: state.Version, StepID: id, RunID: runID, Name: name, Seq: i, Attempt: 1,
			Output: json.RawMessage(out), Worker: "gone", Committed: created.Add(time.Second),
		})
		require.NoError(t, err)
		_, err = assets.Steps.Create(ctx, id, step)
		require.NoError(t, err)
	}
}

func TestWorkerConfigSweepSettings(t *testing.T) {
	t.Parallel()
	ws := NewRegistry()
	require.NoError(t, ws.Register(threeSteps("cfg", newCounter())))
	nc := newEnv(t, Topology{}).conn() // NewWorker refuses a nil connection
	for _, tc := range []struct {
		cfg  WorkerConfig
		want string
	}{
		{WorkerConfig{}, ""},
		{WorkerConfig{SweepInterval: -1, StuckAfter: time.Nanosecond}, ""}, // no sweeper: nothing to check
		{WorkerConfig{AckWait: time.Minute, StuckAfter: 2 * time.Minute}, "StuckAfter must be at least 3 × AckWait (3m0s), got 2m0s"},
		{WorkerConfig{SweepInterval: time.Millisecond}, "SweepInterval must be at least 10ms"},
	} {
		_, err := NewWorker(nc, ws, tc.cfg)
		if tc.want == "" {
			require.NoError(t, err)
		} else {
			require.ErrorContains(t, err, tc.want)
		}
	}
}
