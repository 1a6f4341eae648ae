package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rerunFlow charges, naps, ships and notifies; ship fails (fatally) while
// broken is set. Every step function counts its call by step ID. The nap
// lasts nap: set long before a rerun, a rerun that slept again would not
// end.
func rerunFlow(effects *counter, broken *atomic.Bool, nap *atomic.Int64) *Workflow[int, string] {
	effect := func(name string) func(context.Context) (string, error) {
		return func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			if name == "ship" && broken.Load() {
				return "", Fatal(errors.New("carrier down"))
			}
			return name + " done", nil
		}
	}
	return NewWorkflow("order", func(ctx *Context, in int) (string, error) {
		if _, err := Step(ctx, "charge", effect("charge")); err != nil {
			return "", err
		}
		if err := Sleep(ctx, "nap", time.Duration(nap.Load())); err != nil {
			return "", err
		}
		if _, err := Step(ctx, "ship", effect("ship")); err != nil {
			return "", err
		}
		return Step(ctx, "notify", effect("notify"))
	})
}

// rerunRig is a rerunFlow with its effects, ship broken and a 10ms nap.
type rerunRig struct {
	effects *counter
	broken  *atomic.Bool
	nap     *atomic.Int64
	wf      *Workflow[int, string]
}

func newRerunRig() rerunRig {
	r := rerunRig{effects: newCounter(), broken: new(atomic.Bool), nap: new(atomic.Int64)}
	r.broken.Store(true)
	r.nap.Store(int64(10 * time.Millisecond))
	r.wf = rerunFlow(r.effects, r.broken, r.nap)
	return r
}

// Runs failed at their third step are rerun from where they stopped, by
// five callers at once each: every run is rerun exactly once, its charge
// and nap are never repeated, ship and notify run once under the rerun's
// step IDs, and the two runs link to each other.
func TestRerunFromTheFailedStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	rig := newRerunRig()
	effects, broken, nap, wf := rig.effects, rig.broken, rig.nap, rig.wf
	env.worker(WorkerConfig{Concurrency: 16}, wf)
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	// A client that has a worker admit its reruns, as a producer does.
	byRequest, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)

	const runs = 30
	for i := range runs {
		_, err = Start(ctx, c, wf, i, WithRunID(fmt.Sprintf("o-%d", i)))
		require.NoError(t, err)
	}
	for i := range runs {
		run, err := c.WaitRun(ctx, fmt.Sprintf("o-%d", i))
		require.NoError(t, err)
		require.Equal(t, StatusFailed, run.Status)
	}

	// The plan, before anything is started.
	plan, err := c.Rerun(ctx, "o-0", RerunOptions{DryRun: true})
	require.NoError(t, err)
	require.Nil(t, plan.Start)
	require.Equal(t, "o-0.ship.0", plan.From)
	require.Equal(t, "o-0-rerun-ship-0", plan.RunID)
	require.Equal(t, []string{"charge", "nap"}, stepNames(plan.Kept))
	require.Equal(t, []string{"ship"}, stepNames(plan.Again))
	_, err = c.GetRun(ctx, plan.RunID)
	require.ErrorIs(t, err, ErrRunNotFound, "a dry run started it")

	// Fixed, and the nap made long: a rerun that napped again would hang.
	broken.Store(false)
	nap.Store(int64(time.Hour))
	created := make([]atomic.Int64, runs)
	var wg sync.WaitGroup
	for i := range runs {
		for caller := range 5 {
			wg.Go(func() {
				opts := RerunOptions{Source: fmt.Sprintf("operator-%d", caller)}
				if i%2 == 1 {
					opts.From = "ship" // by name, the same step
				}
				client := c
				if caller%2 == 1 {
					client = byRequest
				}
				res, err := client.Rerun(ctx, fmt.Sprintf("o-%d", i), opts)
				if !errors.Is(err, ErrUnavailable) { // a retry would land on the same run
					require.NoError(t, err)
				}
				if err == nil && res.Start.Outcome == OutcomeCreated {
					created[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	for i := range runs {
		src := fmt.Sprintf("o-%d", i)
		id := src + "-rerun-ship-0"
		require.EqualValues(t, 1, created[i].Load(), "%s: reruns created", src)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
		require.Equal(t, &RerunOf{RunID: src, From: src + ".ship.0"}, run.RerunOf)
		source, err := c.GetRun(ctx, src)
		require.NoError(t, err)
		require.Len(t, source.Reruns, 1, src)
		require.Equal(t, id, source.Reruns[0].RunID)

		require.Equal(t, 1, effects.get(src+".charge.0"), "%s: charge", src)
		require.Equal(t, 0, effects.get(id+".charge.0"), "%s: the rerun charged again", id)
		require.Equal(t, 1, effects.get(src+".ship.0"), "%s: ship", src)
		require.Equal(t, 1, effects.get(id+".ship.0"), "%s: ship rerun", id)
		require.Equal(t, 1, effects.get(id+".notify.0"), "%s: notify", id)
		steps, err := c.Steps(ctx, id)
		require.NoError(t, err)
		require.Equal(t, []string{"charge", "nap", "ship", "notify"}, stepNames(steps))
		require.Equal(t, id+".charge.0", steps[0].StepID)
	}
}

// A rerun refuses what it cannot do, with a typed error, and starts
// nothing.
func TestRerunBadInput(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	rig := newRerunRig()
	rig.nap.Store(int64(time.Hour))
	effects, wf := rig.effects, rig.wf
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, time.Minute)
	_, err := Start(ctx, c, wf, 1, WithRunID("napping"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("napping.charge.0") == 1 }, 30*time.Second, 10*time.Millisecond)

	byRequest, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)
	_, err = c.Rerun(ctx, "napping", RerunOptions{From: "charge"})
	require.ErrorIs(t, err, ErrRunNotEnded)
	_, err = c.Rerun(ctx, "nobody", RerunOptions{})
	require.ErrorIs(t, err, ErrRunNotFound)
	_, err = c.Rerun(ctx, "bad.id", RerunOptions{})
	require.ErrorIs(t, err, ErrInvalidRunID)

	_, err = c.CancelRun(ctx, "napping")
	require.NoError(t, err)
	_, err = c.WaitRun(ctx, "napping")
	require.NoError(t, err)
	for _, from := range []string{"ship", "napping.charge.1", "other.charge.0", "no such step"} {
		_, err = c.Rerun(ctx, "napping", RerunOptions{From: from})
		require.ErrorIs(t, err, ErrStepNotReached, from)
		_, err = byRequest.Rerun(ctx, "napping", RerunOptions{From: from})
		require.ErrorIs(t, err, ErrStepNotReached, from)
	}
	_, err = c.Rerun(ctx, "napping", RerunOptions{From: "charge", RunID: "napping"})
	require.ErrorIs(t, err, ErrInvalidRunID)
	page, err := c.ListRuns(ctx, ListOptions{Workflow: "order"})
	require.NoError(t, err)
	require.Len(t, page.Runs, 1, "a refused rerun started a run")

	// The nap it was cancelled in is where it stopped.
	plan, err := c.Rerun(ctx, "napping", RerunOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, "napping-rerun", plan.RunID)
	require.Equal(t, []string{"charge"}, stepNames(plan.Kept))
	plan, err = c.Rerun(ctx, "napping", RerunOptions{DryRun: true, From: "nap"})
	require.NoError(t, err)
	require.Equal(t, "napping.nap.0", plan.From)
	require.Equal(t, []string{"charge"}, stepNames(plan.Kept))
}

func stepNames(steps []StepRecord) []string {
	out := []string{}
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

// A rerun whose first holder died after copying part of the kept records
// (here: the charge's copy is there, the nap's is not) is completed by the
// next holder, which runs nothing kept; a rerun whose source's records are
// gone by the time a worker takes it fails with ErrRerunSource, code
// kind "rerun", and runs no step.
func TestRerunPartialCopyAndSourceGone(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	rig := newRerunRig()
	effects, broken, nap, wf := rig.effects, rig.broken, rig.nap, rig.wf
	c := env.client()
	ctx := ctxT(t, time.Minute)
	first := startWorker(t, env.conn(), WorkerConfig{}, wf)
	for _, id := range []string{"p-1", "p-2"} {
		_, err := Start(ctx, c, wf, 1, WithRunID(id))
		require.NoError(t, err)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusFailed, run.Status)
	}
	require.NoError(t, first.Stop(ctx))
	broken.Store(false)
	nap.Store(int64(time.Hour))

	// Both reruns are admitted while no worker runs.
	for _, id := range []string{"p-1", "p-2"} {
		res, err := c.Rerun(ctx, id, RerunOptions{})
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, res.Start.Outcome)
	}
	// p-1's rerun: the charge copied, as by a holder that died then.
	v, _, err := c.assets.Steps.Get(ctx, "p-1.charge.0")
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(v, &fields))
	fields["step_id"], fields["run_id"] = "p-1-rerun-ship-0.charge.0", "p-1-rerun-ship-0"
	b, err := json.Marshal(fields)
	require.NoError(t, err)
	_, err = c.assets.Steps.Create(ctx, "p-1-rerun-ship-0.charge.0", b)
	require.NoError(t, err)
	// p-2's source records are gone.
	for _, key := range []string{"p-2.charge.0", "p-2.nap.0", "p-2.ship.0"} {
		require.NoError(t, c.assets.Steps.Raw().Purge(ctx, key))
	}

	env.worker(WorkerConfig{}, wf)
	run, err := c.WaitRun(ctx, "p-1-rerun-ship-0")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, 1, effects.get("p-1.charge.0"))
	require.Zero(t, effects.get("p-1-rerun-ship-0.charge.0"))
	require.Equal(t, 1, effects.get("p-1-rerun-ship-0.ship.0"))
	open, err := c.OpenSteps(ctx, "p-1-rerun-ship-0")
	require.NoError(t, err)
	require.Empty(t, open, "the rerun's note of its copied records shown as a step")

	run, err = c.WaitRun(ctx, "p-2-rerun-ship-0")
	require.NoError(t, err)
	require.Equal(t, StatusFailed, run.Status)
	require.Contains(t, run.Error.Message, ErrRerunSource.Error())
	require.Equal(t, "rerun", run.Error.Kind)
	require.Zero(t, effects.get("p-2-rerun-ship-0.charge.0"))
	require.Zero(t, effects.get("p-2-rerun-ship-0.ship.0"))
}
