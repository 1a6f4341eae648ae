// Package testenv is the test setup every package of the module shares: an
// embedded nats-server per test (its own store directory and free port,
// shut down when the test ends), a connection to it, a test logger, and the
// goroutine-leak check run after a package's tests.
package testenv

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
)

// VerifyNoLeaks runs the tests of m and fails if goroutines are left over,
// except the process-wide ones nats-server keeps after shutdown: named by
// nats-server's own frames, so that a leaked goroutine of the code under
// test that sleeps or reads a socket is still reported.
func VerifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ipQueue[...]).pop"),
	)
}

// Server starts an embedded nats-server with JetStream, file storage in
// t.TempDir() and a free port on 127.0.0.1, shut down when t ends.
func Server(t testing.TB) *natsserver.Server {
	t.Helper()
	srv, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	return srv
}

// Conn connects to srv; the connection is closed when t ends.
func Conn(t testing.TB, srv *natsserver.Server) *nats.Conn {
	t.Helper()
	nc, err := jetstream.Connect(srv.ClientURL(), t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// Logger writes warnings and errors to the test's log.
func Logger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
}
