package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/state"
)

// G9: a workflow's retention decides how long its run IDs are remembered.
// Within it a start is a duplicate; after it the start creates a new run and
// says so (AfterExpiry), and the new run runs its steps again.
func TestRetentionExpiryIsExplicit(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{Retention: time.Hour})
	effects := newCounter()
	wf := NewWorkflow("short", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "once", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return in * 2, nil
		})
	}, WithRetention(2*time.Second))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	h, err := Start(ctx, c, wf, 1, WithRunID("ret-1"))
	require.NoError(t, err)
	require.False(t, h.AfterExpiry)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, out)
	dup, err := Start(ctx, c, wf, 1, WithRunID("ret-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, dup.Outcome, "within the retention: a duplicate")

	require.Eventually(t, func() bool {
		_, err := c.GetRun(context.Background(), "ret-1")
		return errors.Is(err, ErrRunNotFound)
	}, 20*time.Second, 100*time.Millisecond, "the run record never expired")

	again, err := Start(ctx, c, wf, 5, WithRunID("ret-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, again.Outcome)
	require.True(t, again.AfterExpiry, "the start must say the old run expired")
	out, err = again.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, out)
	steps, err := c.Steps(ctx, "ret-1")
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.NotEqual(t, "ret-1.once.0", steps[0].StepID, "the new run has step IDs of its own")
	require.Equal(t, 1, effects.get(steps[0].StepID), "the new run ran its step")
	require.Equal(t, 1, effects.get("ret-1.once.0"))

	// The same through the start envelope.
	require.Eventually(t, func() bool {
		_, err := c.GetRun(context.Background(), "ret-1")
		return errors.Is(err, ErrRunNotFound)
	}, 20*time.Second, 100*time.Millisecond)
	res, err := c.StartByName(ctx, "short", []byte(`7`), WithRunID("ret-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, res.Outcome)
	require.True(t, res.AfterExpiry)

	// A retention longer than the deployment's is refused.
	long := NewWorkflow("long", func(ctx *Context, in int) (int, error) { return in, nil }, WithRetention(2*time.Hour))
	_, err = Start(ctx, c, long, 1, WithRunID("long-1"))
	require.ErrorIs(t, err, ErrInvalidRetention)
}

// storedRun reads the run record of runID as stored.
func storedRun(t *testing.T, c *Client, runID string) state.Run {
	t.Helper()
	v, _, err := c.assets.Runs.Get(ctxT(t, 5*time.Second), runID)
	require.NoError(t, err)
	run, err := state.DecodeRun(v)
	require.NoError(t, err)
	return run
}

// waitExpired waits until the record of runID has expired.
func waitExpired(t *testing.T, c *Client, runID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := c.GetRun(context.Background(), runID)
		return errors.Is(err, ErrRunNotFound)
	}, 20*time.Second, 50*time.Millisecond, "the run record of %s never expired", runID)
}

// G9: a run created after its run ID's retention passed says so
// (after_expiry) for as long as its record is kept, also once it has ended:
// the run's end, written by the worker of its last step, keeps every field
// the record was created with.
func TestAfterExpiryRunStillSaysSoWhenFinished(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := NewWorkflow("flagged", func(ctx *Context, in int) (int, error) {
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				effects.inc(info.StepID)
				return in + 1, nil
			})
			if err != nil {
				return 0, err
			}
			in = v
		}
		return in, nil
	}, WithRetention(2*time.Second))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	h, err := Start(ctx, c, wf, 1, WithRunID("flag-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	waitExpired(t, c, "flag-1")

	again, err := Start(ctx, c, wf, 10, WithRunID("flag-1"), WithSource("svc-b"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, again.Outcome)
	require.True(t, again.AfterExpiry)
	created := storedRun(t, c, "flag-1")
	require.True(t, created.AfterExpiry)
	out, err := again.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 13, out)

	done := storedRun(t, c, "flag-1")
	require.Equal(t, state.StatusCompleted, done.Status)
	require.True(t, done.AfterExpiry, "the finished run lost after_expiry")
	require.Equal(t, "svc-b", done.Source)
	require.Equal(t, 2*time.Second, done.Retention)
	require.Equal(t, created.Fingerprint, done.Fingerprint)
	require.NotZero(t, done.Generation)
	require.Equal(t, created.Generation, done.Generation)
	require.Equal(t, created.Token, done.Token)
	require.True(t, created.CreatedAt.Equal(done.CreatedAt))
	require.Len(t, effects.snapshot(), 6, "both runs ran their three steps")
}

// G9: a running run never expires, however much longer than its retention
// it runs: its record is written with the message TTL "never", which also
// exempts it from the runs bucket's MaxAge (the deployment's retention, here
// the run's too). The retention counts from the run's end: the finished
// record is kept that long, then expires.
func TestRunningRunOutlivesItsRetention(t *testing.T) {
	t.Parallel()
	const retention = 2 * time.Second
	env := newEnv(t, Topology{Retention: retention, DuplicateWindow: time.Second})
	release := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	wf := NewWorkflow("slow", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "block", func(sctx context.Context) (int, error) {
			once.Do(func() { close(started) })
			select {
			case <-release:
				return in * 2, nil
			case <-sctx.Done():
				return 0, sctx.Err()
			}
		})
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	begin := time.Now()
	h, err := Start(ctx, c, wf, 21, WithRunID("slow-1"))
	require.NoError(t, err)
	<-started
	// Until well past the retention (twice over, and the broker's expiry
	// checks), the running run is there.
	for deadline := begin.Add(2*retention + time.Second); time.Now().Before(deadline); {
		run, err := c.GetRun(ctx, "slow-1")
		require.NoError(t, err, "the running run expired %s after it started", time.Since(begin))
		require.Equal(t, StatusRunning, run.Status)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	close(release)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 42, out)

	// Kept for the retention after its end (UpdatedAt is taken before the
	// final write), then gone.
	ended := storedRun(t, c, "slow-1")
	require.Equal(t, state.StatusCompleted, ended.Status)
	for keep := ended.UpdatedAt.Add(retention - 300*time.Millisecond); time.Now().Before(keep); {
		_, err := c.GetRun(ctx, "slow-1")
		require.NoError(t, err, "the finished run expired before its retention passed")
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	waitExpired(t, c, "slow-1")
	marker, err := c.assets.Runs.Latest(ctx, "slow-1")
	require.NoError(t, err)
	require.False(t, marker.Live)
	require.False(t, marker.Time.Before(ended.UpdatedAt.Add(retention)),
		"expired at %s, ended at %s", marker.Time, ended.UpdatedAt)
}

// onceStep is a workflow of one step, "charge", recording its side effect
// under its step ID, with the given retention.
func onceStep(name string, effects *counter, retention time.Duration) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		return Step(ctx, "charge", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return in + 1, nil
		})
	}, WithRetention(retention))
}

// G1, G9: a duplicate start answered "existing" after the broker's window
// leaves nothing in the stream; a producer of the previous version left
// its start task there. Consumed only after the run's retention passed (no
// worker was running), that task creates nothing: no new run, no step runs
// again.
func TestStaleStartTaskAfterRetentionCreatesNothing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: 100 * time.Millisecond})
	effects := newCounter()
	// The retention leaves the duplicate below ample time to pass the
	// broker's window (100ms) before the record expires, on a busy machine
	// too.
	wf := onceStep("res", effects, 5*time.Second)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	w := startWorker(t, env.conn(), WorkerConfig{Topology: env.topo}, wf)
	h, err := Start(ctx, c, wf, 1, WithRunID("res-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Stop(ctx))

	// A duplicate past the broker's window: answered existing, nothing
	// stored; the previous version's producer stored its start task.
	awaitWindowPassed(t, c)
	res, err := c.admit.Admit(ctx, dedupe.Request{RunID: "res-1", Workflow: "res", Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	require.Equal(t, dedupe.Existing, res.Outcome)
	info, err := c.assets.Tasks.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "the duplicate stored a start task")
	publishEarlierStart(t, c, "res", "res-1", json.RawMessage(`1`))
	info, err = c.assets.Tasks.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "the earlier producer's start task is pending")

	waitExpired(t, c, "res-1")
	marker, err := c.assets.Runs.Latest(ctx, "res-1")
	require.NoError(t, err)
	env.worker(WorkerConfig{}, wf)
	waitTasksDrained(t, c)

	_, err = c.GetRun(ctx, "res-1")
	require.ErrorIs(t, err, ErrRunNotFound, "the stale start task created a run")
	after, err := c.assets.Runs.Latest(ctx, "res-1")
	require.NoError(t, err)
	require.Equal(t, marker.Rev, after.Rev, "the run ID's record was written")
	require.Equal(t, map[string]int{"res-1.charge.0": 1}, effects.snapshot(), "a step ran again")
}

// G1: a start that stalls before it writes anything, for longer than the
// run another start created lives and is kept (the run runs, and its
// record expires), creates nothing when it resumes: it gets ErrRetryStart,
// since it overlapped the whole life of the run it duplicated. A start
// made after that creates a new run and says so.
func TestStalledStartCreatesNothingAfterItsRunExpired(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := onceStep("stall", effects, time.Second)
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	admit := dedupe.New(c.assets, dedupe.Config{})
	stalled, resume := make(chan struct{}), make(chan struct{})
	admit.SetHooks(dedupe.Hooks{BeforeCreate: func(string) {
		close(stalled)
		<-resume
	}})
	type result struct {
		res dedupe.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := admit.Admit(ctx, dedupe.Request{RunID: "stall-1", Workflow: "stall", Input: json.RawMessage(`1`), Retention: time.Second})
		done <- result{res, err}
	}()
	<-stalled
	h, err := Start(ctx, c, wf, 1, WithRunID("stall-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	_, err = h.Result(ctx)
	require.NoError(t, err)
	waitExpired(t, c, "stall-1")
	marker, err := c.assets.Runs.Latest(ctx, "stall-1")
	require.NoError(t, err)

	close(resume)
	r := <-done
	require.ErrorIs(t, r.err, ErrRetryStart, "the resumed start got %v", r.res.Outcome)
	after, err := c.assets.Runs.Latest(ctx, "stall-1")
	require.NoError(t, err)
	require.Equal(t, marker.Rev, after.Rev, "the resumed start wrote the run ID's record")
	waitTasksDrained(t, c)
	require.Equal(t, map[string]int{"stall-1.charge.0": 1}, effects.snapshot())

	// Starting again now is a new run, after expiry.
	h, err = Start(ctx, c, wf, 5, WithRunID("stall-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	require.True(t, h.AfterExpiry)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, out)
	require.Len(t, effects.snapshot(), 2)
}

// A workflow retention that every start would refuse is refused once, up
// front: under a second by Register, longer than the deployment's by
// NewWorker, both ErrInvalidRetention.
func TestRetentionOutOfBoundsRefusedBeforeAnyStart(t *testing.T) {
	t.Parallel()
	body := func(*Context, int) (int, error) { return 0, nil }
	r := NewRegistry()
	err := r.Register(NewWorkflow("blink", body, WithRetention(time.Millisecond)))
	require.ErrorIs(t, err, ErrInvalidRetention)
	require.Empty(t, r.Names())

	env := newEnv(t, Topology{Retention: time.Hour})
	long := NewRegistry()
	require.NoError(t, long.Register(NewWorkflow("century", body, WithRetention(100*365*24*time.Hour))))
	_, err = NewWorker(env.conn(), long, WorkerConfig{Topology: Topology{Retention: time.Hour}})
	require.ErrorIs(t, err, ErrInvalidRetention)
	_, err = NewWorker(env.conn(), long, WorkerConfig{})
	require.ErrorIs(t, err, ErrInvalidRetention, "longer than the default 30 days too")

	fits := NewRegistry()
	require.NoError(t, fits.Register(NewWorkflow("hourly", body, WithRetention(time.Hour))))
	_, err = NewWorker(env.conn(), fits, WorkerConfig{Topology: Topology{Retention: time.Hour}})
	require.NoError(t, err)
}
