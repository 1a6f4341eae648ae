package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// A branch whose worker stalls (no ack extension) is redelivered and run
// again on another worker as the next attempt, under the same step ID,
// which commits; the stalled attempt's commit, when its function returns,
// finds the step committed and adopts the stored result (it lost: one
// result is the step's).
func TestStalledBranchsLateCommitAdoptsTheFirst(t *testing.T) {
	t.Parallel()
	const ackWait = 300 * time.Millisecond
	r := newRig(t, ackWait)
	release := make(chan struct{})
	var calls atomic.Int32
	x := func(ctx context.Context) (json.RawMessage, error) {
		info, _ := InfoFrom(ctx)
		if calls.Add(1) == 1 {
			<-release
		}
		return json.Marshal(fmt.Sprintf("attempt %d by call %d", info.Attempt, calls.Load()))
	}
	body := fanOut(x, ok(`"y"`))
	stalled := newHooked()
	a := r.executor("stalled", body, stalled.install)
	r.serveHandlers(1, true, nil, a.Branches()) // branches only, no ack extension
	live := newHooked()
	b := r.executor("live", body, live.install)
	r.serveCounted(b, 2, true, false) // runs only, for now
	r.start("r", `{}`)
	r.eventually(func() bool { return calls.Load() == 1 }, "x did not start on the stalled worker")
	r.serveCounted(b, 2, false, true)

	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	close(release)
	for {
		c := await(r, stalled.commits, "the stalled attempt's commit")
		if c.step == "r.x.0" {
			require.False(t, c.won, "the stalled attempt's late commit won")
			break
		}
	}
	rec := r.step("r.x.0")
	require.Equal(t, "live", rec.Worker)
	require.Equal(t, 2, rec.Attempt, "the redelivery did not count the stalled attempt")
	require.JSONEq(t, `["attempt 2 by call 2","y","z"]`, string(end.Output))
	require.Equal(t, []int{1}, stalled.attempts.of("r.x.0"))
	require.Equal(t, []int{2}, live.attempts.of("r.x.0"))
}
