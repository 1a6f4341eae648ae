package jetflow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// A Start that fails part of the way (its context ends at a different
// point of the start each time: deadlines from 1ms doubling) undoes what
// it set up, and a later Start serves: the worker command starts again
// this way while NATS or JetStream cannot serve a start. The package's
// leak check (TestMain) fails the test if a failed Start left a
// goroutine behind.
func TestWorkerStartsAgainAfterAFailedStart(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("again", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "double", func(context.Context) (int, error) { return 2 * in, nil })
	})
	ws := NewRegistry()
	require.NoError(t, ws.Register(wf))
	w, err := NewWorker(env.conn(), ws, WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	failed := 0
	for d := time.Millisecond; ; d = d * 5 / 4 {
		require.Less(t, d, time.Minute, "Start never succeeded")
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := w.Start(ctx)
		cancel()
		if err == nil {
			break
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("%s: %v", d, err)
		failed++
	}
	stopAtEnd(t, w, 10*time.Second)
	require.Positive(t, failed, "no Start failed part of the way")
	t.Logf("%d failed starts before one served", failed)

	h, err := Start(ctxT(t, 10*time.Second), env.client(), wf, 21, WithRunID("again-1"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 42, out)
}
