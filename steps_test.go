package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sampleWorkflow is the workflow whose step IDs are fixed in
// testdata/golden_step_ids.json. With extra set it has new steps before,
// between and after the original ones, as a later version of the code
// might.
func sampleWorkflow(seen *[]string, mu *sync.Mutex) *Workflow[bool, int] {
	record := func(sctx context.Context) (int, error) {
		info, _ := StepDetailsFrom(sctx)
		mu.Lock()
		*seen = append(*seen, info.StepID)
		mu.Unlock()
		return 0, nil
	}
	return NewWorkflow("sample", func(ctx *Context, extra bool) (int, error) {
		if extra {
			if _, err := Step(ctx, "audit", record); err != nil {
				return 0, err
			}
		}
		if _, err := Step(ctx, "validate", record); err != nil {
			return 0, err
		}
		for range 2 { // the same step called twice
			if _, err := Step(ctx, "notify", record); err != nil {
				return 0, err
			}
		}
		if extra {
			if _, err := Step(ctx, "fraud-check", record); err != nil {
				return 0, err
			}
		}
		if _, err := Step(ctx, "charge", record); err != nil {
			return 0, err
		}
		return 0, nil
	})
}

func runSample(t *testing.T, extra bool) []string {
	env := newEnv(t, Topology{})
	var (
		seen []string
		mu   sync.Mutex
	)
	wf := sampleWorkflow(&seen, &mu)
	env.worker(WorkerConfig{}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, extra, WithRunID("golden-run"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	return seen
}

// G5: step IDs are fixed by run ID, step name and occurrence. The golden
// file pins them; a new version of the workflow with added steps keeps every
// existing step's ID.
func TestStepIDsGolden(t *testing.T) {
	t.Parallel()
	golden := filepath.Join("testdata", "golden_step_ids.json")
	got := runSample(t, false)
	if os.Getenv("JETFLOW_UPDATE_GOLDEN") != "" {
		b, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(golden, append(b, '\n'), 0o644))
	}
	b, err := os.ReadFile(golden)
	require.NoError(t, err)
	var want []string
	require.NoError(t, json.Unmarshal(b, &want))
	require.Equal(t, want, got, "step IDs changed: stored runs would re-run their steps")

	extended := runSample(t, true)
	require.Equal(t, []string{
		"golden-run.audit.0", "golden-run.validate.0", "golden-run.notify.0",
		"golden-run.notify.1", "golden-run.fraud-check.0", "golden-run.charge.0",
	}, extended)
	for _, id := range want {
		require.Contains(t, extended, id, "adding steps changed the ID of an existing step")
	}
}

// G11: a retryable failure is retried with growing backoff until it
// succeeds; the committed result records the attempt.
func TestStepRetriesWithBackoffUntilSuccess(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var (
		mu    sync.Mutex
		times []time.Time
		ids   []string
	)
	const initial = 200 * time.Millisecond
	wf := NewWorkflow("flaky", func(ctx *Context, _ int) (string, error) {
		return Step(ctx, "call", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			mu.Lock()
			defer mu.Unlock()
			times = append(times, time.Now())
			ids = append(ids, info.StepID)
			if info.Attempt < 3 {
				return "", errors.New("upstream unavailable")
			}
			return "ok", nil
		}, WithBackoff(initial, time.Second), WithMaxAttempts(5))
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("flaky-1"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "ok", out)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, times, 3)
	require.Equal(t, []string{"flaky-1.call.0", "flaky-1.call.0", "flaky-1.call.0"}, ids, "retries keep the step ID")
	// Backoff: 200ms then 400ms, each with at most 20% jitter taken off.
	require.GreaterOrEqual(t, times[1].Sub(times[0]), initial*8/10)
	require.GreaterOrEqual(t, times[2].Sub(times[1]), 2*initial*8/10)
	steps, err := c.Steps(ctxT(t, 5*time.Second), "flaky-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, 3, steps[0].Attempt)
}

// G11: a fatal error is not retried; the workflow sees the step's failure as
// a *StepError and can handle it.
func TestFatalStepErrorStopsRetriesAndWorkflowHandlesIt(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := NewWorkflow("charge", func(ctx *Context, _ int) (string, error) {
		_, err := Step(ctx, "charge", func(sctx context.Context) (string, error) {
			effects.inc("charge")
			return "", Fatal(errors.New("card declined"))
		}, WithMaxAttempts(5))
		var se *StepError
		if errors.As(err, &se) && se.Fatal {
			// Compensate instead of failing the run.
			return Step(ctx, "notify-declined", func(context.Context) (string, error) {
				effects.inc("notify")
				return "declined: " + se.StepID, nil
			})
		}
		return "charged", err
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("pay-1"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "declined: pay-1.charge.0", out)
	require.Equal(t, 1, effects.get("charge"), "a fatal error is not retried")
	require.Equal(t, 1, effects.get("notify"))

	steps, err := c.Steps(ctxT(t, 5*time.Second), "pay-1")
	require.NoError(t, err)
	require.Len(t, steps, 2)
	require.True(t, steps[0].Fatal)
	require.Contains(t, steps[0].Error, "card declined")
}

// G11: a step that keeps failing stops after MaxAttempts; a workflow that
// returns the failure fails its run, and the caller gets a *RunError.
func TestStepExhaustsAttemptsAndRunFails(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := NewWorkflow("doomed", func(ctx *Context, _ int) (int, error) {
		return Step(ctx, "call", func(context.Context) (int, error) {
			effects.inc("call")
			return 0, RetryAfter(errors.New("rate limited"), 20*time.Millisecond)
		}, WithMaxAttempts(3))
	})
	env.worker(WorkerConfig{}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 0, WithRunID("doomed-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.ErrorIs(t, err, ErrRunFailed)
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusFailed, re.Status)
	require.Equal(t, "step", re.Kind)
	require.Contains(t, re.Message, "rate limited")
	require.Equal(t, 3, effects.get("call"))
}

// WithRetry's policy is the step's: its MaxAttempts bounds the attempts, and
// an invalid policy is an error the workflow gets without the step running.
func TestWithRetryPolicyBoundsAttempts(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := NewWorkflow("retry-policy", func(ctx *Context, _ int) (string, error) {
		_, err := Step(ctx, "invalid", func(context.Context) (int, error) {
			effects.inc("invalid")
			return 0, nil
		}, WithRetry(RetryPolicy{MaxAttempts: 2, Multiplier: 0.5}))
		if !errors.Is(err, ErrInvalidPolicy) {
			return "", fmt.Errorf("invalid policy: got %v", err)
		}
		_, err = Step(ctx, "call", func(context.Context) (int, error) {
			effects.inc("call")
			return 0, errors.New("down")
		}, WithRetry(RetryPolicy{MaxAttempts: 2, InitialInterval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Multiplier: 2}))
		var se *StepError
		if !errors.As(err, &se) {
			return "", fmt.Errorf("call: got %v", err)
		}
		return fmt.Sprintf("attempts=%d", se.Attempts), nil
	})
	env.worker(WorkerConfig{}, wf)
	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 0, WithRunID("retry-policy-1"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "attempts=2", out)
	require.Equal(t, 2, effects.get("call"))
	require.Equal(t, 0, effects.get("invalid"))
}
