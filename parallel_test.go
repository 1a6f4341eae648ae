package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fanOut starts n steps called "branch" in parallel, awaits them all and
// returns the sum of their results; every branch records its side effect
// under its step ID.
func fanOut(name string, effects *counter) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, n int) (int, error) {
		fs := make([]*Future[int], n)
		for i := range n {
			fs[i] = Go(ctx, "branch", func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				effects.inc(info.StepID)
				return i, nil
			})
		}
		aw := make([]Awaitable, n)
		for i, f := range fs {
			aw[i] = f
		}
		if err := AwaitAll(ctx, aw...); err != nil {
			return 0, err
		}
		sum := 0
		for _, f := range fs {
			v, err := f.Get(ctx)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	})
}

func TestParallelStepsSmoke(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := fanOut("fan", effects)
	env.worker(WorkerConfig{Concurrency: 8}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 10, WithRunID("fan-1"))
	require.NoError(t, err)
	got, err := h.Result(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 45, got)
	snap := effects.snapshot()
	require.Len(t, snap, 10)
	for i := range 10 {
		require.Equal(t, 1, snap[fmt.Sprintf("fan-1.branch.%d", i)])
	}
}

// sequencer lets the branches of a run return in a chosen order: a branch
// called name returns only after the names before it in order have.
type sequencer struct {
	mu    sync.Mutex
	cond  *sync.Cond
	order map[string][]string // run ID → names, in the order they return
	done  map[string]int      // run ID → how many have returned
}

func newSequencer() *sequencer {
	s := &sequencer{order: map[string][]string{}, done: map[string]int{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// turn blocks until it is name's turn in run runID (a name not in the
// order, or a turn already taken, returns at once) and then gives the turn
// to the next.
func (s *sequencer) turn(runID, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	order := s.order[runID]
	want := slices.Index(order, name)
	if want < 0 {
		return
	}
	for s.done[runID] < want {
		s.cond.Wait()
	}
	if s.done[runID] == want {
		s.done[runID]++
		s.cond.Broadcast()
	}
}

// parallelSample starts three steps in parallel in a loop of three rounds,
// awaits them in reverse order, then runs a step and a child: the workflow
// whose step IDs testdata/golden_parallel_step_ids.json fixes.
func parallelSample(seq *sequencer, kid *Workflow[int, int]) *Workflow[int, int] {
	return NewWorkflow("parallel-sample", func(ctx *Context, _ int) (int, error) {
		branch := func(name string, round int) *Future[int] {
			return Go(ctx, name, func(context.Context) (int, error) {
				if round == 0 {
					seq.turn(ctx.RunID(), name)
				}
				return round, nil
			})
		}
		total := 0
		for round := range 3 {
			fs := []*Future[int]{branch("fetch", round), branch("price", round), branch("stock", round)}
			for i := len(fs) - 1; i >= 0; i-- {
				v, err := fs[i].Get(ctx)
				if err != nil {
					return 0, err
				}
				total += v
			}
		}
		sum, err := Step(ctx, "total", func(context.Context) (int, error) { return total, nil })
		if err != nil {
			return 0, err
		}
		return Child(ctx, kid, sum).Get(ctx)
	})
}

// doubler is a child workflow of one step.
func doubler(name string) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, n int) (int, error) {
		return Step(ctx, "double", func(context.Context) (int, error) { return 2 * n, nil })
	})
}

// Step IDs of parallel steps depend only on the order the body starts them:
// two runs whose first round of branches finish in opposite orders have
// the same IDs (relative to their run IDs), fixed by a golden file; the
// child's run ID is derived from its step.
func TestParallelStepIDsGolden(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	seq := newSequencer()
	kid := doubler("doubler")
	wf := parallelSample(seq, kid)
	env.worker(WorkerConfig{Concurrency: 8}, wf, kid)
	c := env.client()
	seq.mu.Lock()
	seq.order["forward"] = []string{"fetch", "price", "stock"}
	seq.order["backward"] = []string{"stock", "price", "fetch"}
	seq.mu.Unlock()

	idsOf := func(runID string) []string {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID(runID))
		require.NoError(t, err)
		got, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err)
		require.Equal(t, 2*(0+3*1+3*2), got)
		steps, err := c.Steps(ctxT(t, 10*time.Second), runID)
		require.NoError(t, err)
		var ids []string
		byCommit := map[string]time.Time{}
		for _, s := range steps {
			ids = append(ids, strings.TrimPrefix(s.StepID, runID))
			byCommit[s.Name+"-"+strings.TrimPrefix(s.StepID, runID+"."+s.Name+".")] = s.CommittedAt
		}
		run, err := c.GetRun(ctxT(t, 10*time.Second), runID)
		require.NoError(t, err)
		require.Len(t, run.Children, 1)
		require.Equal(t, runID+"=doubler=0", run.Children[0].RunID)
		require.Equal(t, runID+".doubler.0", run.Children[0].StepID)
		// The first round finished in the order the sequencer imposed.
		order := seq.order[runID]
		for i := 1; i < len(order); i++ {
			require.False(t, byCommit[order[i]+"-0"].Before(byCommit[order[i-1]+"-0"]), "run %s: %s committed before %s", runID, order[i], order[i-1])
		}
		return ids
	}
	forward, backward := idsOf("forward"), idsOf("backward")
	require.Equal(t, forward, backward, "the order branches finish in changed step IDs")

	golden := filepath.Join("testdata", "golden_parallel_step_ids.json")
	if os.Getenv("JETFLOW_UPDATE_GOLDEN") != "" {
		b, err := json.MarshalIndent(forward, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(golden, append(b, '\n'), 0o644))
	}
	b, err := os.ReadFile(golden)
	require.NoError(t, err)
	var want []string
	require.NoError(t, json.Unmarshal(b, &want))
	require.Equal(t, want, forward, "step IDs changed: stored runs would re-run their steps")
}
