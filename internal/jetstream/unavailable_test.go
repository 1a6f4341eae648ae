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
	for _, err := range []error{getErr, createErr, shortErr} {
		require.Error(t, err)
		require.True(t, IsTransient(err), "%v", err)
		u := Unavailable(err)
		require.ErrorIs(t, u, ErrUnavailable)
		require.ErrorIs(t, u, errors.Unwrap(err), "the cause is kept")
		require.Same(t, u, Unavailable(u), "marked once")
	}

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
