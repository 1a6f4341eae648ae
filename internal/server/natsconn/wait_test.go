package natsconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Wait tries again after an error that may pass, recording it for the
// readiness check, and returns the first success; an error marked
// Permanent, or a refused credential, ends it at once, returned as it is
// (Cause takes the mark off); so does the end of ctx.
func TestWait(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	log := zerolog.New(&logs)

	var w Waiting
	calls := 0
	v, err := Wait(t.Context(), "nats://x:4222", log, &w, func(context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, fmt.Errorf("dial: %w", nats.ErrNoServers)
		}
		return 42, nil
	})
	require.NoError(t, err)
	require.Equal(t, 42, v)
	require.Equal(t, 3, calls)
	require.Contains(t, w.String(), "waiting for NATS at nats://x:4222")
	require.Contains(t, w.String(), "attempt 2: dial: nats: no servers available")
	require.Equal(t, 2, strings.Count(logs.String(), `"message":"waiting for NATS at nats://x:4222"`), logs.String())
	require.Contains(t, logs.String(), `"attempts":3`)

	// A wait for something else says what it waits for.
	logs.Reset()
	calls = 0
	blocked := errors.New("runs would be blocked")
	_, err = Wait(t.Context(), "nats://x:4222", log, &w, func(context.Context) (int, error) {
		if calls++; calls < 2 {
			return 0, WaitingFor("runs in flight to end", fmt.Errorf("start: %w", blocked))
		}
		return 1, nil
	})
	require.NoError(t, err)
	require.Contains(t, w.String(), "waiting for runs in flight to end for ")
	require.Contains(t, w.String(), "attempt 1: start: runs would be blocked")
	require.Contains(t, logs.String(), `"error":"start: runs would be blocked"`)
	require.Contains(t, logs.String(), `"message":"waiting for runs in flight to end"`)
	require.NotContains(t, logs.String(), "waiting for NATS")
	require.ErrorIs(t, WaitingFor("x", blocked), blocked)
	require.Nil(t, WaitingFor("x", nil))

	cause := errors.New("consumer exists with another filter")
	for _, fail := range []error{Permanent(cause), fmt.Errorf("connect: %w", nats.ErrAuthorization)} {
		calls = 0
		_, err = Wait(t.Context(), "nats://x:4222", log, nil, func(context.Context) (int, error) {
			calls++
			return 0, fail
		})
		require.Equal(t, 1, calls, "%v: tried again", fail)
		require.ErrorIs(t, err, errors.Unwrap(fail))
	}
	require.Equal(t, cause, Cause(Permanent(cause)))
	require.Nil(t, Permanent(nil))

	ctx, cancel := context.WithTimeout(t.Context(), 3*RetryFirst)
	defer cancel()
	_, err = Wait(ctx, "nats://x:4222", log, nil, func(context.Context) (int, error) { return 0, nats.ErrNoServers })
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
