package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTimelineRecordsAttempts: a step that fails twice and then succeeds
// commits a record that says when its attempt started and which attempts
// failed before it (when, on which worker, with what error); a step that
// failed and waits for its retry is an open step with its failure, until
// it commits.
func TestTimelineRecordsAttempts(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var flaky, slow atomic.Int32
	release := make(chan struct{})
	wf := NewWorkflow("timeline", func(ctx *Context, in int) (int, error) {
		a, err := Step(ctx, "flaky", func(context.Context) (int, error) {
			if flaky.Add(1) <= 2 {
				return 0, fmt.Errorf("flaky failure %d", flaky.Load())
			}
			return in + 1, nil
		}, WithBackoff(10*time.Millisecond, 10*time.Millisecond))
		if err != nil {
			return 0, err
		}
		return Step(ctx, "slow", func(context.Context) (int, error) {
			if slow.Add(1) == 1 {
				return 0, errors.New("not yet")
			}
			<-release
			return a * 2, nil
		}, WithBackoff(timerMinDelayForTest, timerMinDelayForTest))
	})
	env.worker(WorkerConfig{Name: "w-timeline"}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	before := time.Now()
	_, err := c.StartByName(ctx, "timeline", json.RawMessage(`1`), WithRunID("tl-1"))
	require.NoError(t, err)

	// The slow step failed once and waits for its retry (a timer): open.
	// (The flaky step may show as open while it is retried, too.)
	var slowStep *OpenStep
	for slowStep == nil {
		open, err := c.OpenSteps(ctx, "tl-1")
		require.NoError(t, err)
		for i, o := range open {
			if o.StepID == "tl-1.slow.0" {
				slowStep = &open[i]
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("the slow step never showed as open")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.Equal(t, "slow", slowStep.Name)
	require.Len(t, slowStep.Attempts, 1)
	require.Equal(t, 1, slowStep.Attempts[0].Attempt)
	require.Equal(t, "not yet", slowStep.Attempts[0].Error)
	require.Equal(t, "w-timeline", slowStep.Attempts[0].Worker)
	open, err := c.OpenSteps(ctx, "tl-1")
	require.NoError(t, err)
	require.Len(t, open, 1, "the flaky step committed before the slow one ran")
	require.Equal(t, "tl-1.slow.0", open[0].StepID)
	close(release)

	run, err := c.WaitRun(ctx, "tl-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "%+v", run.Error)
	open, err = c.OpenSteps(ctx, "tl-1")
	require.NoError(t, err)
	require.Empty(t, open, "a committed step is not open")

	steps, err := c.Steps(ctx, "tl-1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	f := steps[0]
	require.Equal(t, "flaky", f.Name)
	require.Equal(t, 3, f.Attempt)
	require.Len(t, f.Attempts, 2)
	for i, a := range f.Attempts {
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, fmt.Sprintf("flaky failure %d", i+1), a.Error)
		require.Equal(t, "w-timeline", a.Worker)
		require.False(t, a.StartedAt.Before(before.Add(-time.Second)), "attempt %d started %s", a.Attempt, a.StartedAt)
		require.False(t, a.EndedAt.Before(a.StartedAt))
	}
	require.False(t, f.StartedAt.Before(f.Attempts[1].EndedAt), "the committed attempt starts after the failed ones")
	require.False(t, f.CommittedAt.Before(f.StartedAt))
	s := steps[1]
	require.Equal(t, 2, s.Attempt)
	require.Len(t, s.Attempts, 1)
	require.Equal(t, "not yet", s.Attempts[0].Error)
}

// timerMinDelayForTest is a backoff long enough to wait as a timer.
const timerMinDelayForTest = 2 * time.Second

// TestOpenStepRunByTheStartTask: a run's first step runs inside its start
// task, whose attempt log is the run's own (<run>.start); a failure there
// still shows the step as open until it commits.
func TestOpenStepRunByTheStartTask(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var calls atomic.Int32
	release := make(chan struct{})
	wf := NewWorkflow("first-fails", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "first", func(context.Context) (int, error) {
			if calls.Add(1) == 1 {
				return 0, errors.New("first try fails")
			}
			<-release
			return in, nil
		}, WithBackoff(timerMinDelayForTest, timerMinDelayForTest))
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	_, err := c.StartByName(ctx, "first-fails", json.RawMessage(`3`), WithRunID("tl-first"))
	require.NoError(t, err)
	var open []OpenStep
	for len(open) == 0 {
		open, err = c.OpenSteps(ctx, "tl-first")
		require.NoError(t, err)
		select {
		case <-ctx.Done():
			t.Fatal("the failed first step never showed as open")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.Len(t, open, 1)
	require.Equal(t, "tl-first.first.0", open[0].StepID)
	require.Equal(t, "first", open[0].Name)
	require.Len(t, open[0].Attempts, 1)
	require.Equal(t, "first try fails", open[0].Attempts[0].Error)
	close(release)
	_, err = c.WaitRun(ctx, "tl-first")
	require.NoError(t, err)
	open, err = c.OpenSteps(ctx, "tl-first")
	require.NoError(t, err)
	require.Empty(t, open)
	steps, err := c.Steps(ctx, "tl-first")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Len(t, steps[0].Attempts, 1)
	require.Equal(t, "first try fails", steps[0].Attempts[0].Error)
}
