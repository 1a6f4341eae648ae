package jetflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// gatedSteps is a workflow of steps "a" then "b": a signals started and
// waits for release; each records its start in effects.
func gatedSteps(name string, effects *counter, started chan<- string, release <-chan struct{}) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, _ int) (int, error) {
		for _, step := range []string{"a", "b"} {
			if _, err := Step(ctx, step, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				effects.inc(info.StepID)
				if step == "a" {
					started <- info.RunID
					<-release
				}
				return 0, nil
			}); err != nil {
				return 0, err
			}
		}
		return 0, nil
	})
}

// A cancel recorded while a step runs, whose notice the worker never gets
// (the record is written, nothing is published): the running step's commit
// is refused (the cancel moved the run's lease) and the next step does not
// start.
func TestCancelHoldsWhenTheNoticeIsLost(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	logs := &testenv.LogBuffer{}
	effects := newCounter()
	started, release := make(chan string, 1), make(chan struct{})
	wf := gatedSteps("lost-notice", effects, started, release)
	env.worker(WorkerConfig{Logger: zerolog.New(logs).Level(zerolog.InfoLevel)}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("lost-1"))
	require.NoError(t, err)
	<-started
	_, cancelled, err := c.runs.Cancel(ctxT(t, 10*time.Second), "lost-1") // the record only: no notice
	require.NoError(t, err)
	require.True(t, cancelled)
	close(release)

	require.Eventually(t, func() bool {
		for _, l := range levelLines(t, logs, "info", "task dropped") {
			if l["run_id"] == "lost-1" {
				return true
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "the run's task is dropped:\n%s", logs.String())
	require.Equal(t, map[string]int{"lost-1.a.0": 1}, effects.snapshot(), "a step started after the cancel was recorded")
	steps, err := c.Steps(ctxT(t, 5*time.Second), "lost-1")
	require.NoError(t, err)
	require.Empty(t, steps, "a commit made after the cancel was recorded")
	_, err = h.Result(ctxT(t, 10*time.Second))
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusCancelled, re.Status)
}

// Cancelling a parent cancels its attached child, whose running step sees
// its context cancelled with ErrRunCancelled; a detached child goes on and
// completes. A repeat cancel says it was already cancelled.
func TestCancelParentCancelsChildren(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var (
		mu    sync.Mutex
		cause = map[string]error{}
	)
	running := make(chan string, 2)
	releaseDetached := make(chan struct{})
	kid := NewWorkflow("waiting-kid", func(ctx *Context, detached bool) (string, error) {
		return Step(ctx, "wait", func(sctx context.Context) (string, error) {
			running <- ctx.RunID()
			if detached {
				<-releaseDetached
				return "done", nil
			}
			<-sctx.Done()
			mu.Lock()
			cause[ctx.RunID()] = context.Cause(sctx)
			mu.Unlock()
			return "", sctx.Err()
		})
	})
	parent := NewWorkflow("cancelled-parent", func(ctx *Context, _ int) (string, error) {
		attached := Child(ctx, kid, false)
		detached := Child(ctx, kid, true, Detached(), WithChildRunID("free-kid"))
		if err := AwaitAll(ctx, attached, detached); err != nil {
			return "", err
		}
		return "not cancelled", nil
	})
	env.worker(WorkerConfig{Concurrency: 6}, parent, kid)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, parent, 0, WithRunID("cp-1"))
	require.NoError(t, err)
	seen := map[string]bool{<-running: true, <-running: true}
	require.Equal(t, map[string]bool{"cp-1=waiting-kid=0": true, "free-kid": true}, seen)

	out, err := c.CancelRun(ctxT(t, 10*time.Second), "cp-1")
	require.NoError(t, err)
	require.False(t, out.AlreadyCancelled)
	require.Equal(t, []string{"cp-1=waiting-kid=0"}, out.Children)
	again, err := c.CancelRun(ctxT(t, 10*time.Second), "cp-1")
	require.NoError(t, err)
	require.True(t, again.AlreadyCancelled)

	_, err = h.Result(ctxT(t, 10*time.Second))
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusCancelled, re.Status)
	child, err := c.WaitRun(ctxT(t, 10*time.Second), "cp-1=waiting-kid=0")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, child.Status)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return errors.Is(cause["cp-1=waiting-kid=0"], ErrRunCancelled)
	}, 10*time.Second, 10*time.Millisecond, "the child's running step saw its context cancelled by the run's cancel")

	close(releaseDetached)
	free, err := c.WaitRun(ctxT(t, 20*time.Second), "free-kid")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, free.Status, "a detached child outlives its parent's cancel")
}

// Cancels racing with completion: every run ends either completed (the
// cancel got ErrRunEnded) or cancelled (the cancel succeeded), its record
// and its result agree, and a cancelled run starts at most the one step
// whose check of the record preceded the cancel.
func TestCancelRacingCompletion(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const runs, steps = 30, 4
	var (
		mu      sync.Mutex
		entered = map[string][]time.Time{}
	)
	wf := NewWorkflow("racy", func(ctx *Context, _ int) (int, error) {
		for i := range steps {
			if _, err := Step(ctx, fmt.Sprintf("s%d", i), func(context.Context) (int, error) {
				mu.Lock()
				entered[ctx.RunID()] = append(entered[ctx.RunID()], time.Now())
				mu.Unlock()
				return i, nil
			}); err != nil {
				return 0, err
			}
		}
		return steps, nil
	})
	env.worker(WorkerConfig{Concurrency: 8}, wf)
	c := env.client()
	var wg sync.WaitGroup
	type result struct {
		err error
		at  time.Time
	}
	results := make([]result, runs)
	for i := range runs {
		id := fmt.Sprintf("racy-%d", i)
		_, err := Start(ctxT(t, 10*time.Second), c, wf, i, WithRunID(id))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.CancelRun(ctxT(t, 10*time.Second), id)
			results[i] = result{err: err, at: time.Now()}
		}()
	}
	wg.Wait()
	cancelledRuns := 0
	for i, r := range results {
		id := fmt.Sprintf("racy-%d", i)
		run, err := c.WaitRun(ctxT(t, 30*time.Second), id)
		require.NoError(t, err)
		switch {
		case r.err == nil:
			cancelledRuns++
			require.Equal(t, StatusCancelled, run.Status, id)
			mu.Lock()
			late := 0
			for _, at := range entered[id] {
				if at.After(r.at) {
					late++
				}
			}
			mu.Unlock()
			require.LessOrEqual(t, late, 1, "%s: steps started after its cancel returned", id)
		case errors.Is(r.err, ErrRunEnded):
			require.Equal(t, StatusCompleted, run.Status, id)
		default:
			t.Fatalf("%s: cancel: %v", id, r.err)
		}
	}
	t.Logf("%d of %d runs cancelled before they completed", cancelledRuns, runs)
}
