package workflow

// A draining worker (Config.Stopping): its holders start no further
// sequential step and hand their runs over at the step boundary, and the
// run tasks it still receives are handed back unstarted; no attempt is
// counted for a step a delivery never started.

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

func TestDrainingHolderHandsOverAtAStepBoundary(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var draining atomic.Bool
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		if _, err := seqStep(c, "a", func(context.Context) (json.RawMessage, error) {
			draining.Store(true) // the worker starts draining while a runs
			return json.RawMessage(`"a"`), nil
		}); err != nil {
			return nil, err
		}
		return seqStep(c, "b", func(ctx context.Context) (json.RawMessage, error) {
			info, _ := InfoFrom(ctx)
			return json.Marshal(info.Attempt)
		})
	}
	hk := newHooked()
	released := make(chan string, 16)
	drainer := r.executor("drainer", body, func(c *Config) {
		hk.install(c)
		c.Stopping = draining.Load
		c.Hooks.AfterRelease = func(runID string) { released <- runID }
	})
	hkTaker := newHooked()
	taker := r.executor("taker", body, hkTaker.install)
	r.serve(drainer, 1, false)
	r.start("r", `{}`)
	require.Equal(t, commitSeen{"r.a.0", true}, await(r, hk.commits, "a's commit"))
	// The run's hand-over is a released lease marked unstarted.
	r.eventually(func() bool { l, _ := r.lease("r"); return l != nil && l.State == state.LeaseReleased },
		"the draining holder did not hand the run over")
	l, _ := r.lease("r")
	require.True(t, l.Unstarted)
	require.False(t, l.Inherited, "a holder that committed a step since it took the run hands it over as not inherited")
	require.Equal(t, "drainer", l.Worker)

	r.serve(taker, 1, false)
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.JSONEq(t, `1`, string(end.Output), "a step the draining holder never started used up an attempt")
	require.Equal(t, "drainer", r.step("r.a.0").Worker)
	require.Equal(t, "taker", r.step("r.b.0").Worker)
	require.Empty(t, hk.attempts.of("r.b.0"), "the draining holder started a step")
	require.Equal(t, []int{1}, hkTaker.attempts.of("r.b.0"))
	require.Nil(t, r.attempts("r.b.0"))
	// Whatever the draining worker received after its hand-over went
	// back unstarted.
	for {
		select {
		case id := <-released:
			require.Equal(t, "r", id)
			continue
		default:
		}
		break
	}
	r.acked(jetstream.RunSubject(wf, "r"))
}
