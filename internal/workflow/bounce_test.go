package workflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// A task handed back to another build waits within the upper half of its
// ceiling: 100ms doubled per delivery, at most 1s while a worker of that
// build is live and 5s otherwise; and never the same delay every time (a
// fixed one hands it to the same wrong worker at each try).
func TestBounceDelay(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		delivered int
		live      bool
		ceiling   time.Duration
	}{
		{1, true, 100 * time.Millisecond},
		{2, false, 200 * time.Millisecond},
		{4, true, 800 * time.Millisecond},
		{5, true, time.Second},
		{20, true, time.Second},
		{5, false, 1600 * time.Millisecond},
		{20, false, 5 * time.Second},
	} {
		e := &Executor{cfg: Config{BuildLive: func(wf, build string) bool {
			require.Equal(t, "flow", wf)
			require.Equal(t, "v1", build)
			return tc.live
		}}}
		d := &delivery{task: state.Task{Workflow: "flow"}, delivered: tc.delivered}
		seen := map[time.Duration]bool{}
		for range 50 {
			got := e.bounceDelay(d, "v1")
			require.GreaterOrEqual(t, got, tc.ceiling/2, "delivery %d, live %v", tc.delivered, tc.live)
			require.LessOrEqual(t, got, tc.ceiling, "delivery %d, live %v", tc.delivered, tc.live)
			seen[got] = true
		}
		require.Greater(t, len(seen), 1, "delivery %d, live %v: the same delay every time", tc.delivered, tc.live)
	}
}
