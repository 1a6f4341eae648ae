package workflow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2}
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 10: time.Second} {
		for range 50 {
			d := Backoff(p, attempt)
			require.LessOrEqual(t, d, want, "attempt %d", attempt)
			require.GreaterOrEqual(t, d, want*8/10, "attempt %d: at most 20%% jitter", attempt)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, ValidateRetry(RetryPolicy{}))
	for _, p := range []RetryPolicy{{MaxAttempts: -1}, {InitialInterval: -1}, {MaxInterval: -1}, {Multiplier: 0.5}} {
		require.ErrorIs(t, ValidateRetry(p), ErrInvalidPolicy)
	}
	d := RetryWithDefaults(RetryPolicy{})
	require.Equal(t, 5, d.MaxAttempts)
}
