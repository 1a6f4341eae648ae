package workflow

// A draining worker (Config.Stopping): its holders start no further
// sequential step and hand their runs over at the step boundary, and the
// run tasks it still receives are handed back unstarted; no attempt is
// counted for a step a delivery never started.

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
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
	// The draining worker's pool keeps pulling (only Stopping is set, the
	// pool does not stop), so it hands the run task back with no delay
	// and gets it again at once, as often as it can until the taker
	// takes it: a number of releases that grows with the machine's load.
	// The hook records them without ever blocking (a full channel would
	// stall the drainer's only slot on the run task, its ack deadline
	// extended, and the taker would never get it).
	var released releases
	drainer := r.executor("drainer", body, func(c *Config) {
		hk.install(c)
		c.Stopping = draining.Load
		c.Hooks.AfterRelease = released.add
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
	for _, id := range released.seen() {
		require.Equal(t, "r", id)
	}
	r.acked(jetstream.RunSubject(wf, "r"))
}

// releases records the run IDs of Hooks.AfterRelease, however many.
type releases struct {
	mu  sync.Mutex
	ids []string
}

func (rs *releases) add(runID string) {
	rs.mu.Lock()
	rs.ids = append(rs.ids, runID)
	rs.mu.Unlock()
}

func (rs *releases) seen() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.ids)
}
