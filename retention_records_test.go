package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The retention of a run's records: a committed step, its attempt and wait
// records and its hook token live as long as the run does, however long it
// waits, and go with the run's retention after its end. The deployment's
// retention here is recordsRetention; every test waits well past it.
const (
	recordsRetention = 2 * time.Second
	recordsSweep     = 50 * time.Millisecond
	recordsAckWait   = time.Second
)

// longWaitIn says how a longWait run waits between its two steps: a
// sleep of Nap, an event "go", or the hook Token.
type longWaitIn struct {
	Kind  string        `json:"kind"`
	Nap   time.Duration `json:"nap,omitempty"`
	Token string        `json:"token,omitempty"`
}

// longWait runs step "first", waits as its input says, then runs step
// "second"; each step records its side effect under its step ID.
func longWait(effects *counter) *Workflow[longWaitIn, int] {
	step := func(ctx *Context, name string, in int) (int, error) {
		return Step(ctx, name, func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return in + 1, nil
		})
	}
	return NewWorkflow("longwait", func(ctx *Context, in longWaitIn) (int, error) {
		n, err := step(ctx, "first", 0)
		if err != nil {
			return 0, err
		}
		var got int
		switch in.Kind {
		case "sleep":
			err = Sleep(ctx, "nap", in.Nap)
		case "event":
			got, err = WaitEvent[int](ctx, "go")
		case "hook":
			got, err = WaitEvent[int](ctx, "go", WithHookToken(in.Token))
		default:
			err = fmt.Errorf("unknown wait %q", in.Kind)
		}
		if err != nil {
			return 0, err
		}
		return step(ctx, "second", n+got)
	}, WithEvent[int]("go"))
}

// recordsEnv is a deployment whose retention is recordsRetention, with a
// worker serving longWait whose sweeper passes every recordsSweep.
func recordsEnv(t *testing.T, effects *counter) (*testEnv, *Client) {
	t.Helper()
	env := newEnv(t, Topology{Retention: recordsRetention, DuplicateWindow: time.Second})
	env.worker(WorkerConfig{AckWait: recordsAckWait, StuckAfter: 3 * recordsAckWait, SweepInterval: recordsSweep}, longWait(effects))
	return env, env.client()
}

// outliveRetention waits until twice the deployment's retention (and a
// second for the broker's expiry checks) has passed since the run's step
// "first" was committed, checking all along that its record is there.
func outliveRetention(t *testing.T, c *Client, runID string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	var first time.Time
	require.Eventually(t, func() bool {
		steps, err := c.Steps(ctx, runID)
		if err == nil && len(steps) > 0 {
			first = steps[0].CommittedAt
		}
		return !first.IsZero()
	}, 10*time.Second, 10*time.Millisecond, "step first never committed")
	for until := first.Add(2*recordsRetention + time.Second); time.Now().Before(until); {
		steps, err := c.Steps(ctx, runID)
		require.NoError(t, err)
		require.NotEmpty(t, steps, "step first expired %s after its commit, its run still waiting", time.Since(first))
		require.Equal(t, runID+".first.0", steps[0].StepID)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// requireRecordsExpire checks that the records of the ended run runID —
// its steps and lease, its attempt and wait records, and the hook token,
// when there is one — are kept for the run's retention after its end and
// gone within a margin after that: the whole seconds schedules count (the
// due time and the schedule both round up), two sweeper passes and an
// AckWait for the purge.
func requireRecordsExpire(t *testing.T, c *Client, runID, token string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	ended := storedRun(t, c, runID)
	require.True(t, ended.Status.Terminal())
	identity := state.RunIdentity(runID, ended.Generation)
	left := func() []string {
		var keys []string
		for _, kv := range []struct {
			name    string
			entries func() ([]string, error)
		}{
			{"steps", func() ([]string, error) { return keysOf(c.assets.Steps.Prefix(ctx, identity, 0)) }},
			{"attempts", func() ([]string, error) { return keysOf(c.assets.Attempts.Prefix(ctx, identity, 0)) }},
			{"hooks", func() ([]string, error) {
				if token == "" {
					return nil, nil
				}
				return keysOf(c.assets.Hooks.Last(ctx, token))
			}},
		} {
			got, err := kv.entries()
			require.NoError(t, err)
			for _, k := range got {
				keys = append(keys, kv.name+"/"+k)
			}
		}
		return keys
	}
	require.NotEmpty(t, left(), "the ended run has no records to expire")
	for keep := ended.UpdatedAt.Add(recordsRetention - 300*time.Millisecond); time.Now().Before(keep); {
		require.Contains(t, left(), "steps/"+runID+".first.0", "a record went before the run's retention passed")
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	margin := 2*time.Second + 2*recordsSweep + recordsAckWait
	deadline := ended.UpdatedAt.Add(recordsRetention + margin)
	for keys := left(); len(keys) > 0; keys = left() {
		require.True(t, time.Now().Before(deadline), "records left %s after the run's end: %v",
			time.Since(ended.UpdatedAt), keys)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("records gone %s after the run's end (retention %s)", time.Since(ended.UpdatedAt), recordsRetention)
}

// keysOf are the keys of a batch read's entries.
func keysOf(entries []jetstream.Entry, err error) ([]string, error) {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return keys, err
}

// waitPastRetention starts a longWait run runID with input in, waits
// until twice the deployment's retention has passed since its first step
// (outliveRetention), resumes it with resume (nil: it wakes by itself),
// and checks that it returns want with every step run once and that its
// records then expire with its retention (token: its hook's, or "").
func waitPastRetention(t *testing.T, runID string, in longWaitIn, resume func(ctx context.Context, c *Client) (EventResult, error), want int) *Client {
	t.Helper()
	effects := newCounter()
	_, c := recordsEnv(t, effects)
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, longWait(effects), in, WithRunID(runID))
	require.NoError(t, err)
	outliveRetention(t, c, runID)
	if resume != nil {
		res, err := resume(ctx, c)
		require.NoError(t, err)
		require.Equal(t, EventDelivered, res.Outcome)
	}
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, want, out)
	require.Equal(t, map[string]int{runID + ".first.0": 1, runID + ".second.0": 1}, effects.snapshot())
	requireRecordsExpire(t, c, runID, in.Token)
	return c
}

// A run that sleeps for longer than the deployment's retention keeps its
// committed step: it completes without running it again, and its records
// go with the run's retention after its end.
func TestCommittedStepOutlivesALongSleep(t *testing.T) {
	t.Parallel()
	waitPastRetention(t, "nap-1", longWaitIn{Kind: "sleep", Nap: 2*recordsRetention + 2*time.Second}, nil, 2)
}

// A run parked on an event wait for longer than the deployment's retention
// keeps its committed step: the event resumes it, and it completes without
// running the step again.
func TestCommittedStepOutlivesALongEventWait(t *testing.T) {
	t.Parallel()
	waitPastRetention(t, "ev-1", longWaitIn{Kind: "event"}, func(ctx context.Context, c *Client) (EventResult, error) {
		return c.SendEvent(ctx, "ev-1", "go", "e-1", json.RawMessage(`10`))
	}, 12)
}

// A run parked on a hook wait for longer than the deployment's retention
// keeps its committed step and its hook token: the token resumes it after
// the retention, and it completes without running the step again. The
// token goes with the run's records.
func TestHookTokenOutlivesALongWait(t *testing.T) {
	t.Parallel()
	c := waitPastRetention(t, "hk-1", longWaitIn{Kind: "hook", Token: "tok-hook-1"}, func(ctx context.Context, c *Client) (EventResult, error) {
		return c.Resume(ctx, "tok-hook-1", "e-1", json.RawMessage(`20`))
	}, 22)
	_, err := c.Resume(ctxT(t, 10*time.Second), "tok-hook-1", "e-2", json.RawMessage(`1`))
	require.ErrorIs(t, err, ErrHookNotFound, "the token of an expired run")
}
