package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

type polInput struct {
	Mode string `json:"mode"` // "ok", "fail" or "block"
}

// policyWorkflow's one step succeeds, fails fatally (so the run fails), or
// blocks until hold is closed.
func policyWorkflow(hold <-chan struct{}, effects *counter) *Workflow[polInput, string] {
	return NewWorkflow("pol", func(ctx *Context, in polInput) (string, error) {
		return Step(ctx, "work", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			switch in.Mode {
			case "fail":
				return "", Fatal(errors.New("boom"))
			case "block":
				select {
				case <-hold:
				case <-sctx.Done():
					return "", sctx.Err()
				}
			}
			return "done " + info.StepID, nil
		})
	})
}

// runIn brings a new run to a state: running, completed, failed or
// cancelled. It returns the input it was started with.
func runIn(t *testing.T, c *Client, wf *Workflow[polInput, string], id string, st RunStatus) polInput {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	in := map[RunStatus]polInput{
		StatusRunning: {"block"}, StatusCompleted: {"ok"}, StatusFailed: {"fail"}, StatusCancelled: {"block"},
	}[st]
	h, err := Start(ctx, c, wf, in, WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	switch st {
	case StatusCompleted, StatusFailed:
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, st, run.Status)
	case StatusCancelled:
		require.NoError(t, cancelRun(ctx, c, id))
		run, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCancelled, run.Status)
	}
	return in
}

// G3: every policy × run state, through the Go SDK and through the start
// envelope (request-reply), against a real server.
func TestConflictPolicyTable(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	hold := make(chan struct{})
	effects := newCounter()
	wf := policyWorkflow(hold, effects)
	env.worker(WorkerConfig{}, wf)
	t.Cleanup(func() { close(hold) }) // before the worker stops (cleanups run last first)
	c := env.client()

	cases := []struct {
		state  RunStatus
		policy ConflictPolicy
		want   Outcome // "" means ErrDuplicateRejected
	}{
		{StatusRunning, ConflictPolicy{}, OutcomeExisting},
		{StatusRunning, ConflictPolicy{WhileRunning: RejectWhileRunning}, ""},
		{StatusCompleted, ConflictPolicy{}, OutcomeExisting},
		{StatusCompleted, ConflictPolicy{AfterCompleted: RejectAfterEnd}, ""},
		{StatusCompleted, ConflictPolicy{AfterCompleted: StartNew}, OutcomeRestarted},
		{StatusCompleted, ConflictPolicy{AfterFailed: StartNew}, OutcomeExisting},
		{StatusFailed, ConflictPolicy{}, OutcomeExisting},
		{StatusFailed, ConflictPolicy{AfterFailed: RejectAfterEnd}, ""},
		{StatusFailed, ConflictPolicy{AfterFailed: StartNew}, OutcomeRestarted},
		{StatusFailed, ConflictPolicy{AfterCompleted: StartNew}, OutcomeExisting},
		{StatusCancelled, ConflictPolicy{}, OutcomeExisting},
		{StatusCancelled, ConflictPolicy{AfterFailed: RejectAfterEnd}, ""},
		{StatusCancelled, ConflictPolicy{AfterFailed: StartNew}, OutcomeRestarted},
	}
	for i, tc := range cases {
		for _, path := range []string{"sdk", "envelope"} {
			id := fmt.Sprintf("pol-%d-%s", i, path)
			name := fmt.Sprintf("%s %+v via %s", tc.state, tc.policy, path)
			in := runIn(t, c, wf, id, tc.state)
			ctx := ctxT(t, 20*time.Second)
			var (
				got    Outcome
				status RunStatus
				err    error
			)
			if path == "sdk" {
				var h *Handle[string]
				h, err = Start(ctx, c, wf, in, WithRunID(id), WithConflictPolicy(tc.policy))
				if err == nil {
					got, status = h.Outcome, h.Status
				}
			} else {
				var res StartResult
				raw, _ := json.Marshal(in)
				res, err = c.StartByName(ctx, "pol", raw, WithRunID(id), WithConflictPolicy(tc.policy))
				got, status = res.Outcome, res.Status
			}
			if tc.want == "" {
				require.ErrorIs(t, err, ErrDuplicateRejected, name)
				continue
			}
			require.NoError(t, err, name)
			require.Equal(t, tc.want, got, name)
			run, err := c.GetRun(ctx, id)
			require.NoError(t, err, name)
			if tc.want == OutcomeRestarted {
				require.Equal(t, 1, run.Generation, name)
				// The new run may already have been picked up (its start
				// task is published before the record is replaced) and even
				// have ended.
				require.NotEmpty(t, status, name)
			} else {
				require.Equal(t, 0, run.Generation, name)
				require.Equal(t, tc.state, status, "%s: got %q", name, got)
			}
		}
	}
	// A restarted completed run ran its step again under a new step ID.
	run, err := c.WaitRun(ctxT(t, 20*time.Second), "pol-4-sdk")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `"done pol-4-sdk/1.work.0"`, string(run.Output))
	steps, err := c.Steps(ctxT(t, 5*time.Second), "pol-4-sdk")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "pol-4-sdk/1.work.0", steps[0].StepID)
	require.Equal(t, 1, effects.get("pol-4-sdk.work.0"))
	require.Equal(t, 1, effects.get("pol-4-sdk/1.work.0"))

	// The policy can be the workflow's default instead of a per-call one.
	strict := NewWorkflow("pol-strict", func(ctx *Context, in polInput) (string, error) { return "ok", nil },
		WithDefaultConflictPolicy(ConflictPolicy{AfterCompleted: RejectAfterEnd}))
	env.worker(WorkerConfig{}, strict)
	h, err := Start(ctxT(t, 5*time.Second), c, strict, polInput{"ok"}, WithRunID("strict-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	_, err = Start(ctxT(t, 5*time.Second), c, strict, polInput{"ok"}, WithRunID("strict-1"))
	require.ErrorIs(t, err, ErrDuplicateRejected)
	_, err = c.StartByName(ctxT(t, 5*time.Second), "pol-strict", json.RawMessage(`{"mode":"ok"}`), WithRunID("strict-1"))
	require.ErrorIs(t, err, ErrDuplicateRejected)
	_, err = Start(ctxT(t, 5*time.Second), c, strict, polInput{"ok"}, WithRunID("strict-1"), WithConflictPolicy(ConflictPolicy{}))
	require.NoError(t, err, "a per-call policy overrides the workflow's")
	// Under a rejecting policy, the same key with another input is still a
	// conflict (HTTP 422), not the policy's refusal (409): only a repeat of
	// the same request is the policy's to refuse.
	_, err = Start(ctxT(t, 5*time.Second), c, strict, polInput{"other"}, WithRunID("strict-1"))
	require.ErrorIs(t, err, ErrIdempotencyConflict)
	require.NotErrorIs(t, err, ErrDuplicateRejected)
}

// G3: 32 concurrent "start new after failure" calls on one failed run ID
// create exactly one new run; the rest attach to it.
func TestConcurrentStartNewAfterFailureCreatesOneRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	hold := make(chan struct{})
	close(hold)
	effects := newCounter()
	wf := policyWorkflow(hold, effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	runIn(t, c, wf, "again-1", StatusFailed)

	const n = 32
	outcomes := make([]Outcome, n)
	errs := make([]error, n)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			h, err := Start(ctxT(t, 20*time.Second), c, wf, polInput{"ok"}, WithRunID("again-1"),
				WithConflictPolicy(ConflictPolicy{AfterFailed: StartNew}))
			errs[i] = err
			if err == nil {
				outcomes[i] = h.Outcome
			}
		}()
	}
	close(ready)
	wg.Wait()
	restarted := 0
	for i := range n {
		require.NoError(t, errs[i])
		if outcomes[i] == OutcomeRestarted {
			restarted++
		} else {
			require.Equal(t, OutcomeExisting, outcomes[i])
		}
	}
	require.Equal(t, 1, restarted, "exactly one new run")
	run, err := c.WaitRun(ctxT(t, 20*time.Second), "again-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.Equal(t, 1, run.Generation)
	waitTasksDrained(t, c)
	require.Equal(t, 1, effects.get("again-1/1.work.0"), "the new run's step ran once")
	require.Zero(t, effects.get("again-1/2.work.0"), "no second new run")
}

// Cancel makes a running run final at once; its further steps are not run.
func TestCancelStopsARun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	effects := newCounter()
	wf := NewWorkflow("cancellable", func(ctx *Context, _ int) (int, error) {
		if _, err := Step(ctx, "first", func(context.Context) (int, error) {
			effects.inc("first")
			started <- struct{}{}
			<-release
			return 1, nil
		}); err != nil {
			return 0, err
		}
		return Step(ctx, "second", func(context.Context) (int, error) {
			effects.inc("second")
			return 2, nil
		})
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("cx-1"))
	require.NoError(t, err)
	<-started
	require.NoError(t, cancelRun(ctxT(t, 5*time.Second), c, "cx-1"))
	require.NoError(t, cancelRun(ctxT(t, 5*time.Second), c, "cx-1"), "cancelling twice is fine")
	close(release)

	_, err = h.Result(ctxT(t, 10*time.Second))
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusCancelled, re.Status)
	waitTasksDrained(t, c)
	run, err := c.GetRun(ctxT(t, 5*time.Second), "cx-1")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, run.Status, "the first step's completion does not undo the cancel")
	require.Zero(t, effects.get("second"), "no step after the cancel")

	// Completed and unknown runs cannot be cancelled.
	done := threeSteps("done", newCounter())
	env.worker(WorkerConfig{}, done)
	hd, err := Start(ctxT(t, 5*time.Second), c, done, 1, WithRunID("cx-2"))
	require.NoError(t, err)
	_, err = hd.Result(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.ErrorIs(t, cancelRun(ctxT(t, 5*time.Second), c, "cx-2"), ErrRunEnded)
	require.ErrorIs(t, cancelRun(ctxT(t, 5*time.Second), c, "nope"), ErrRunNotFound)
}

// A start-new whose caller died after publishing the new generation's start
// task but before replacing the record: the worker that receives the task
// finishes the replacement (compare-and-set on the revision it carries) and
// runs the new generation.
func TestInterruptedStartNewIsFinishedByTheWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	hold := make(chan struct{})
	close(hold)
	effects := newCounter()
	wf := policyWorkflow(hold, effects)
	c := env.client()
	env.worker(WorkerConfig{}, wf)
	runIn(t, c, wf, "half-1", StatusFailed)
	_, rev, err := c.assets.Runs.Get(ctxT(t, 5*time.Second), "half-1")
	require.NoError(t, err)

	task, err := state.Encode(state.Task{V: state.Version, RunID: "half-1", Workflow: "pol",
		Input: json.RawMessage(`{"mode":"ok"}`), Token: "died", Generation: 1, PrevRev: rev})
	require.NoError(t, err)
	identity := state.RunIdentity("half-1", 1)
	_, err = jetstream.PublishTask(ctxT(t, 5*time.Second), c.assets.JS, jetstream.RunSubject("pol", identity), identity, task)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		run, err := c.GetRun(context.Background(), "half-1")
		return err == nil && run.Generation == 1 && run.Status == StatusCompleted
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, effects.get("half-1/1.work.0"))

	// A stale copy of that task (an older revision) changes nothing.
	stale, err := state.Encode(state.Task{V: state.Version, RunID: "half-1", Workflow: "pol",
		Input: json.RawMessage(`{"mode":"ok"}`), Token: "late", Generation: 1, PrevRev: rev})
	require.NoError(t, err)
	_, err = jetstream.PublishTask(ctxT(t, 5*time.Second), c.assets.JS, jetstream.RunSubject("pol", identity), identity+"-late", stale)
	require.NoError(t, err)
	waitTasksDrained(t, c)
	run, err := c.GetRun(ctxT(t, 5*time.Second), "half-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.Equal(t, 1, effects.get("half-1/1.work.0"))
}

// cancelRun is CancelRun's error alone.
func cancelRun(ctx context.Context, c *Client, runID string) error {
	_, err := c.CancelRun(ctx, runID)
	return err
}
