package jetstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
)

// The errors a real server's outage produces are transient, through the
// wrapping of the helpers that return them, and Unavailable marks them
// with ErrUnavailable while keeping the cause.
func TestOutageErrorsAreTransient(t *testing.T) {
	t.Parallel()
	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := Connect(srv.ClientURL(), t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	a, err := Provision(ctx(t), nc, Topology{}, CreateOrUpdate)
	require.NoError(t, err)
	_, err = a.Runs.Create(ctx(t), "k", []byte("v"))
	require.NoError(t, err)

	srv.Shutdown()
	_, _, getErr := a.Runs.Get(ctx(t), "k")
	_, createErr := a.Runs.Create(ctx(t), "k2", []byte("v"))
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, shortErr := a.Runs.Get(short, "k")
	watcher, watchErr := a.Runs.Raw().Watch(ctx(t), "k")
	if watcher != nil {
		require.NoError(t, watcher.Stop())
	}
	disconnected := 0
	for _, err := range []error{getErr, createErr, shortErr, watchErr} {
		require.Error(t, err)
		require.True(t, IsTransient(err), "%v", err)
		u := Unavailable(err)
		require.ErrorIs(t, u, ErrUnavailable)
		if inner := errors.Unwrap(err); inner != nil {
			require.ErrorIs(t, u, inner, "the cause is kept")
		}
		require.ErrorIs(t, u, err)
		require.Same(t, u, Unavailable(u), "marked once")
		// A write while disconnected is called a disconnect, not a full
		// buffer: jetflow's connections have no reconnect buffer.
		require.NotContains(t, u.Error(), "outbound buffer", "%v", u)
		if errors.Is(u, nats.ErrReconnectBufExceeded) {
			require.Contains(t, u.Error(), "NATS unavailable, retry later: ")
			require.Contains(t, u.Error(), Disconnected)
			disconnected++
		}
	}
	require.NotZero(t, disconnected, "a write while the server is down fails as a disconnect")

	// Closed by its program, the connection says so.
	closed, err := Connect(srv.ClientURL(), t.Name()+"-closed", nats.RetryOnFailedConnect(true))
	require.NoError(t, err)
	closed.Close()
	_, pubErr := closed.Request("x", nil, time.Second)
	require.Contains(t, Unavailable(pubErr).Error(), "connection closed")

	// Back up: the same calls succeed.
	require.NoError(t, srv.Restart())
	require.Eventually(t, func() bool {
		_, _, err := a.Runs.Get(context.Background(), "k")
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
}

// Each transient condition the NATS client and JetStream report is
// classified as such; answers that decide (not found, CAS conflicts) and
// other errors are not, and Unavailable leaves them unchanged.
func TestClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("boom"), false},
		{context.Canceled, false},
		{ErrExists, false},
		{ErrNotFound, false},
		{fmt.Errorf("x: %w", nats.ErrReconnectBufExceeded), true},
		{nats.ErrConnectionReconnecting, true},
		{nats.ErrConnectionClosed, true},
		{nats.ErrConnectionDraining, true},
		{nats.ErrDisconnected, true},
		{nats.ErrNoServers, true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{natsjs.ErrJetStreamNotEnabled, true},
		{natsjs.ErrNoStreamResponse, true},
		{natsjs.ErrServerShutdown, true},
		{&natsjs.APIError{Code: 500, ErrorCode: 10023}, true}, // insufficient resources
		{&natsjs.APIError{Code: 503, ErrorCode: 10008}, true}, // cluster not available
		{&natsjs.APIError{Code: 500, ErrorCode: 10118}, true}, // stream offline
		{&natsjs.APIError{Code: 503, ErrorCode: 1}, true},
		{&natsjs.APIError{Code: 400, ErrorCode: 10071}, false}, // wrong last sequence
		{&natsjs.APIError{Code: 404, ErrorCode: 10059}, false}, // stream not found
		{fmt.Errorf("%w: x", ErrUnavailable), true},
	} {
		require.Equal(t, tc.want, IsTransient(tc.err), "%v", tc.err)
		if !tc.want {
			require.Equal(t, tc.err, Unavailable(tc.err))
		}
	}
}
