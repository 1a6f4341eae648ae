package jetflow

import (
	"context"
	"encoding/json"
	"errors"
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
		vs, err := GetAll(ctx, fs)
		if err != nil {
			return 0, err
		}
		sum := 0
		for _, v := range vs {
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

// sequencer lets the branches of a run commit in a chosen order: a branch
// called name returns only after the names before it in order have
// returned and been committed (committed tells; nil: returned is enough).
type sequencer struct {
	mu        sync.Mutex
	cond      *sync.Cond
	order     map[string][]string // run ID → names, in the order they return
	done      map[string]int      // run ID → how many have returned
	committed func(runID, name string) bool
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
	order := s.order[runID]
	want := slices.Index(order, name)
	if want < 0 {
		s.mu.Unlock()
		return
	}
	for s.done[runID] < want {
		s.cond.Wait()
	}
	s.mu.Unlock()
	if want > 0 && s.committed != nil {
		// The one before has returned; its commit follows, on a loaded
		// machine not at once.
		tick := time.NewTicker(time.Millisecond)
		for !s.committed(runID, order[want-1]) {
			<-tick.C
		}
		tick.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
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
	seq.committed = func(runID, name string) bool {
		steps, err := c.Steps(ctxT(t, 10*time.Second), runID)
		return err == nil && slices.ContainsFunc(steps, func(s StepRecord) bool { return s.StepID == runID+"."+name+".0" })
	}
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

// AwaitFirst picks the step committed first, and keeps that choice on
// every later replay, when the slower branch has been committed too: a
// step named after the winner runs once, and the loser's never.
func TestAwaitFirstIsTheSameOnEveryReplay(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	release := make(chan struct{})
	wf := NewWorkflow("race", func(ctx *Context, _ int) (string, error) {
		slow := Go(ctx, "slow", func(sctx context.Context) (string, error) {
			select {
			case <-release:
				return "slow", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		})
		fast := Go(ctx, "fast", func(context.Context) (string, error) { return "fast", nil })
		won, err := AwaitFirst(ctx, slow, fast)
		if err != nil {
			return "", err
		}
		after, err := Step(ctx, fmt.Sprintf("after-%d", won), func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepName)
			return info.StepName, nil
		})
		if err != nil {
			return "", err
		}
		s, err := slow.Get(ctx) // the loser is still awaited: its commit replays the body again
		return after + "/" + s, err
	})
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("race-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("after-1") == 1 }, 20*time.Second, 10*time.Millisecond,
		"the fast branch won and the body went on past AwaitFirst")
	close(release)
	got, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "after-1/slow", got)
	require.Equal(t, map[string]int{"after-1": 1}, effects.snapshot(), "a replay picked another winner")
}

// A child's output reaches its parent; its failure reaches the parent as a
// *StepError the parent can handle; both runs are linked.
func TestChildResultAndFailureReachTheParent(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	kid := doubler("kid")
	failing := NewWorkflow("failing-kid", func(ctx *Context, n int) (int, error) {
		return Step(ctx, "boom", func(context.Context) (int, error) {
			return 0, Fatal(ErrorWithCode("out_of_stock", errors.New("no stock")))
		})
	})
	parent := NewWorkflow("parent", func(ctx *Context, n int) (string, error) {
		ok, err := Child(ctx, kid, n).Get(ctx)
		if err != nil {
			return "", err
		}
		_, err = Child(ctx, failing, n).Get(ctx)
		var se *StepError
		if !errors.As(err, &se) {
			return "", fmt.Errorf("want a *StepError, got %v", err)
		}
		return fmt.Sprintf("%d %s %s %s", ok, se.ChildRunID, se.ChildStatus, se.Code), nil
	})
	env.worker(WorkerConfig{Concurrency: 4}, parent, kid, failing)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, parent, 21, WithRunID("p-1"))
	require.NoError(t, err)
	got, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, "42 p-1=failing-kid=0 failed out_of_stock", got)

	run, err := c.GetRun(ctxT(t, 10*time.Second), "p-1")
	require.NoError(t, err)
	require.Equal(t, []RunLink{
		{RunID: "p-1=kid=0", Workflow: "kid", StepID: "p-1.kid.0"},
		{RunID: "p-1=failing-kid=0", Workflow: "failing-kid", StepID: "p-1.failing-kid.0"},
	}, run.Children)
	child, err := c.GetRun(ctxT(t, 10*time.Second), "p-1=kid=0")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, child.Status)
	require.Equal(t, &RunLink{RunID: "p-1", Workflow: "parent", StepID: "p-1.kid.0"}, child.Parent)
	steps, err := c.Steps(ctxT(t, 10*time.Second), "p-1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.Equal(t, "p-1=kid=0", steps[0].Child)
	require.Equal(t, "p-1=failing-kid=0", steps[1].Child)
}

// Bad input to the new calls: a clear error in the body, nothing started,
// nothing stored damaged.
func TestParallelAndChildBadInput(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	kid := doubler("kid2")
	unregistered := doubler("nobody-serves-this")
	var (
		mu      sync.Mutex
		leaked  *Future[int]
		results = map[string]string{}
	)
	note := func(runID, what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		results[runID+" "+what] = fmt.Sprint(err)
	}
	wf := NewWorkflow("bad", func(ctx *Context, mode string) (int, error) {
		switch mode {
		case "leak":
			f := Go(ctx, "kept", func(context.Context) (int, error) { return 1, nil })
			mu.Lock()
			leaked = f
			mu.Unlock()
			return f.Get(ctx)
		case "foreign":
			mu.Lock()
			f := leaked
			mu.Unlock()
			_, err := f.Get(ctx)
			if !errors.Is(err, ErrForeignFuture) {
				return 0, fmt.Errorf("foreign future: %v", err)
			}
			_, err = AwaitFirst(ctx)
			if !errors.Is(err, ErrForeignFuture) {
				return 0, fmt.Errorf("AwaitFirst of none: %v", err)
			}
			return 0, nil
		case "bad-id":
			_, err := Child(ctx, kid, 1, WithChildRunID("no spaces allowed")).Get(ctx)
			if !errors.Is(err, ErrInvalidRunID) {
				return 0, fmt.Errorf("invalid child run ID: %v", err)
			}
			_, err = Go(ctx, "bad name!", func(context.Context) (int, error) { return 0, nil }).Get(ctx)
			if !errors.Is(err, ErrInvalidName) {
				return 0, fmt.Errorf("invalid step name: %v", err)
			}
			return 0, nil
		case "unregistered":
			_, err := Child(ctx, unregistered, 1).Get(ctx)
			var se *StepError
			if !errors.As(err, &se) || se.ChildStatus != "" || !strings.Contains(se.Message, "not registered") {
				return 0, fmt.Errorf("unregistered child: %v", err)
			}
			note(ctx.RunID(), "unregistered", err)
			return 0, nil
		}
		return 0, fmt.Errorf("unknown mode %q", mode)
	})
	env.worker(WorkerConfig{Concurrency: 4}, wf, kid)
	c := env.client()
	for _, mode := range []string{"leak", "foreign", "bad-id", "unregistered"} {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, mode, WithRunID("bad-"+mode))
		require.NoError(t, err)
		_, err = h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err, mode)
	}
	require.Contains(t, results["bad-unregistered unregistered"], `workflow "nobody-serves-this" is not registered by any worker`)
	for _, id := range []string{"bad-bad-id=kid2=0", "no spaces allowed", "bad-unregistered=nobody-serves-this=0"} {
		_, err := c.GetRun(ctxT(t, 10*time.Second), strings.ReplaceAll(id, " ", "-"))
		require.ErrorIs(t, err, ErrRunNotFound, "no child run was started: %s", id)
	}
	steps, err := c.Steps(ctxT(t, 10*time.Second), "bad-leak")
	require.NoError(t, err)
	require.Len(t, steps, 1, "the leaking run's own step is intact")
}
