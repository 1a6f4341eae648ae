package workflow

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// A holder stopped (as by SIGSTOP: no heartbeat, no lease renewal) after
// its lease check and before it calls the step function loses its run to
// the redelivery of its task on another worker. When it resumes, past its
// lease, it proves the lease again before the call, finds it taken and
// calls nothing: the step's effect happens once, the live worker's.
func TestHolderStoppedBeforeTheStepCallDoesNotCallIt(t *testing.T) {
	t.Parallel()
	const ackWait = 300 * time.Millisecond
	r := newRig(t, ackWait)
	var calls atomic.Int32
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return seqStep(c, "a", func(context.Context) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`"a"`), nil
		})
	}
	stoppedAt, resume := make(chan struct{}), make(chan struct{})
	var stoppedOnce atomic.Bool
	stalled := r.executor("stalled", body, func(c *Config) {
		c.Hooks.NoHeartbeat = true
		c.Hooks.BeforeAttempt = func(stepID string, _ int) {
			if stepID == "r.a.0" && stoppedOnce.CompareAndSwap(false, true) {
				close(stoppedAt)
				<-resume // stopped between the lease check and the call
			}
		}
	})
	pool := r.newPool(1, true)
	require.NoError(t, pool.Consume(r.consumer(jetstream.RunTasks), 1, stalled.Runs()))
	r.start("r", `{}`)
	select {
	case <-stoppedAt:
	case <-time.After(r.within()):
		t.Fatal("the stalled holder never reached the step")
	}
	r.serve(r.executor("live", body, nil), 1, false)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.EqualValues(t, 1, calls.Load(), "the live worker's call")

	close(resume)
	// Stop returns once the stalled handler has returned.
	ctx, cancel := context.WithTimeout(context.Background(), r.within())
	defer cancel()
	require.NoError(t, pool.Stop(ctx))
	require.EqualValues(t, 1, calls.Load(), "the stalled holder called the step after it resumed")
	require.Equal(t, "live", r.step("r.a.0").Worker)
}
