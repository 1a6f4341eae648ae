package jetflow

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A duplicate the conflict policy rejects is the same *RejectedError from
// Start (admitted in process) and from StartByName (a worker's reply), with
// the run ID and the status the policy saw: the error's type does not
// depend on the way the start went.
func TestRejectedErrorIsTheSameOnEveryPath(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rj", func(ctx *Context, n int) (int, error) { return n, nil },
		WithDefaultConflictPolicy(ConflictPolicy{AfterCompleted: RejectAfterEnd}))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 1, WithRunID("rj-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.NoError(t, err)

	_, inProcess := Start(ctx, c, wf, 1, WithRunID("rj-1"))
	_, byName := c.StartByName(ctx, "rj", json.RawMessage(`1`), WithRunID("rj-1"))
	for how, err := range map[string]error{"Start": inProcess, "StartByName": byName} {
		var re *RejectedError
		require.ErrorAs(t, err, &re, how)
		require.ErrorIs(t, err, ErrDuplicateRejected, how)
		require.Equal(t, RejectedError{RunID: "rj-1", Status: StatusCompleted}, *re, how)
	}
}
