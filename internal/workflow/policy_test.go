package workflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2}
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 10: time.Second} {
		for range 50 {
			d := p.Backoff(attempt)
			require.LessOrEqual(t, d, want, "attempt %d", attempt)
			require.GreaterOrEqual(t, d, want*8/10, "attempt %d: at most 20%% jitter", attempt)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, RetryPolicy{}.Validate())
	for _, p := range []RetryPolicy{{MaxAttempts: -1}, {InitialInterval: -1}, {MaxInterval: -1}, {Multiplier: 0.5}} {
		require.ErrorIs(t, p.Validate(), ErrInvalidPolicy)
	}
	d := RetryPolicy{}.WithDefaults()
	require.Equal(t, 5, d.MaxAttempts)
}

func TestHistoryCacheIsBounded(t *testing.T) {
	t.Parallel()
	c := newHistoryCache(2)
	for _, run := range []string{"r1", "r2", "r3"} {
		c.put(run, &state.Step{RunID: run, StepID: run + ".a.0"})
	}
	_, ok := c.get("r1", "r1.a.0")
	require.False(t, ok, "oldest run evicted")
	_, ok = c.get("r3", "r3.a.0")
	require.True(t, ok)
	c.forget("r3")
	_, ok = c.get("r3", "r3.a.0")
	require.False(t, ok)
}
