package jetflow

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Mistakes a new team makes in its first afternoon, each refused where it
// can first be known: a step started from a goroutine of the body's own
// fails at the call; steps started and never awaited fail the run when the
// body returns (they were never run); a wait for an event the workflow
// does not declare fails at the call. (jetflowtest.New's dry run reports
// all three before a run starts: jetflowtest's TestNewReportsMisuse.)
func TestMistakesCaughtWhereMade(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	effect := func(sctx context.Context) (string, error) {
		info, _ := StepDetailsFrom(sctx)
		effects.inc(info.StepID)
		return "ok", nil
	}
	fromGoroutine := NewWorkflow("from-goroutine", func(ctx *Context, in string) (string, error) {
		errs := make(chan error, 1)
		go func() {
			_, err := Step(ctx, "send", effect)
			errs <- err
		}()
		return "", <-errs
	})
	unawaited := NewWorkflow("unawaited", func(ctx *Context, in string) (string, error) {
		if _, err := Step(ctx, "first", effect); err != nil {
			return "", err
		}
		Go(ctx, "forgotten", effect)
		return "done", nil
	})
	undeclared := NewWorkflow("undeclared", func(ctx *Context, in string) (string, error) {
		return WaitEvent[string](ctx, "paid")
	})
	env.worker(WorkerConfig{}, fromGoroutine, unawaited, undeclared)
	c := env.client()
	ctx := ctxT(t, time.Minute)

	h, err := Start(ctx, c, fromGoroutine, "x", WithRunID("g-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.ErrorContains(t, err, ErrWrongGoroutine.Error())
	require.Zero(t, effects.get("g-1.send.0"))

	h, err = Start(ctx, c, unawaited, "x", WithRunID("u-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	var re *RunError
	require.True(t, errors.As(err, &re), "%v", err)
	require.Equal(t, "unawaited_steps", re.Code)
	require.Contains(t, re.Message, "u-1.forgotten.0")
	require.Equal(t, 1, effects.get("u-1.first.0"))
	require.Zero(t, effects.get("u-1.forgotten.0"))

	h, err = Start(ctx, c, undeclared, "x", WithRunID("e-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.ErrorContains(t, err, `does not declare event "paid"`)
}
