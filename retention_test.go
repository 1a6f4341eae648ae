package jetflow

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
			info, _ := StepInfo(sctx)
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
