package jetflow

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/embedded"
)

// TestConnectUnsafeConnection: NewWorker and NewClient refuse a connection
// with a reconnect buffer (a plain nats.Connect), saying which setting and
// how to fix it, and accept one from Connect or without the buffer.
func TestConnectUnsafeConnection(t *testing.T) {
	t.Parallel()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ws := NewRegistry()
	require.NoError(t, ws.Register(NewWorkflow("connectcheck", func(_ *Context, in int) (int, error) { return in, nil })))
	conn := func(connect func(string, ...nats.Option) (*nats.Conn, error), opts ...nats.Option) *nats.Conn {
		t.Helper()
		nc, err := connect(url, opts...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}

	plain := conn(nats.Connect)
	_, err = NewWorker(plain, ws, WorkerConfig{Logger: zerolog.Nop()})
	require.ErrorIs(t, err, ErrUnsafeConnection)
	for _, want := range []string{"reconnect buffer is on (nats.ReconnectBufSize 8388608)", "jetflow.Connect", "nats.ReconnectBufSize(-1)"} {
		require.ErrorContains(t, err, want)
	}
	_, err = NewClient(ctx, plain, ClientConfig{})
	require.ErrorIs(t, err, ErrUnsafeConnection)
	require.NotErrorIs(t, err, ErrUnavailable)
	_, err = NewClient(ctx, conn(nats.Connect, nats.ReconnectBufSize(1024)), ClientConfig{})
	require.ErrorContains(t, err, "nats.ReconnectBufSize 1024")

	// Connect refuses an option that turns the buffer back on.
	_, err = Connect(url, nats.ReconnectBufSize(1<<20))
	require.ErrorIs(t, err, ErrUnsafeConnection)

	// Accepted: Connect, a buffer turned off, no reconnects at all.
	for _, nc := range []*nats.Conn{conn(Connect, nats.Name(t.Name())), conn(nats.Connect, nats.ReconnectBufSize(-1)), conn(nats.Connect, nats.NoReconnect())} {
		_, err := NewClient(ctx, nc, ClientConfig{})
		require.NoError(t, err)
		_, err = NewWorker(nc, ws, WorkerConfig{Logger: zerolog.Nop()})
		require.NoError(t, err)
	}
	nc := conn(Connect)
	require.Equal(t, -1, nc.Opts.MaxReconnect, "reconnects forever")

	_, err = NewClient(ctx, nil, ClientConfig{})
	require.ErrorContains(t, err, "connection is nil")
}

// TestConnectUnreachable: a server that cannot be reached is unavailable.
func TestConnectUnreachable(t *testing.T) {
	t.Parallel()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	url := srv.ClientURL()
	srv.Shutdown()
	_, err = Connect(url)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, nats.ErrNoServers)
}

// TestConnectDefaultLogger: a worker without a logger reports warnings and
// errors; zerolog.Nop() silences it.
func TestConnectDefaultLogger(t *testing.T) {
	t.Parallel()
	require.Equal(t, zerolog.WarnLevel, WorkerConfig{}.WithDefaults().Logger.GetLevel())
	require.Equal(t, zerolog.Disabled, WorkerConfig{Logger: zerolog.Nop()}.WithDefaults().Logger.GetLevel())
	require.Equal(t, zerolog.DebugLevel, WorkerConfig{Logger: zerolog.New(nil).Level(zerolog.DebugLevel)}.WithDefaults().Logger.GetLevel())
}

// ClientConfig has its defaults in one place, as WorkerConfig has, and a
// negative RequestTimeout is refused before NATS is touched.
func TestClientConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	d := ClientConfig{}.WithDefaults()
	require.Equal(t, "go-sdk", d.Name)
	require.Equal(t, 10*time.Second, d.RequestTimeout)
	kept := ClientConfig{Name: "orders-api", RequestTimeout: time.Second}.WithDefaults()
	require.Equal(t, "orders-api", kept.Name)
	require.Equal(t, time.Second, kept.RequestTimeout)

	env := newEnv(t, Topology{})
	_, err := NewClient(ctxT(t, 5*time.Second), env.conn(), ClientConfig{RequestTimeout: -time.Second})
	require.ErrorContains(t, err, "RequestTimeout must not be negative")
}
