package natsserver

import (
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestStartOnATakenPort: a second embedded server on a port that a
// first one holds fails at once with ErrPortInUse naming the address, not
// with ErrNotReady after its ReadyTimeout (which it could only
// reach by waiting that long).
func TestStartOnATakenPort(t *testing.T) {
	t.Parallel()
	first, err := Start(Config{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(first.Shutdown)
	_, port, err := net.SplitHostPort(first.ClientURL()[len("nats://"):])
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)

	const readyTimeout = time.Hour // a wait for readiness would outlast the test's deadline
	_, err = Start(Config{DataDir: t.TempDir(), Port: p, ReadyTimeout: readyTimeout})
	require.ErrorIs(t, err, ErrPortInUse)
	require.False(t, errors.Is(err, ErrNotReady))
	var pe *PortInUseError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, p, pe.Port)
	require.Contains(t, err.Error(), "127.0.0.1:"+port+": address already in use")

	// The first server is untouched.
	nc, err := nats.Connect(first.ClientURL())
	require.NoError(t, err)
	nc.Close()
}

// TestStartOnABadHost: a host that is no local address is the
// listen error at once.
func TestStartOnABadHost(t *testing.T) {
	t.Parallel()
	_, err := Start(Config{DataDir: t.TempDir(), Host: "192.0.2.1", Port: 4999, ReadyTimeout: time.Hour})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrNotReady) || errors.Is(err, ErrPortInUse), "%v", err)
	require.Contains(t, err.Error(), "192.0.2.1:4999")
}
