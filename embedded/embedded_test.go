package embedded_test

import (
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/embedded"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// TestStart: a started server takes connections with JetStream enabled on
// the port it picked, and Shutdown ends WaitForShutdown.
func TestStart(t *testing.T) {
	t.Parallel()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	require.NotContains(t, srv.ClientURL(), ":-1")

	nc, err := jetflow.Connect(srv.ClientURL(), nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	_, err = js.AccountInfo()
	require.NoError(t, err, "JetStream enabled")

	stopped := make(chan struct{})
	go func() {
		srv.WaitForShutdown()
		close(stopped)
	}()
	srv.Shutdown()
	<-stopped
	srv.Shutdown() // again: nothing
}

func TestStartNeedsStoreDir(t *testing.T) {
	t.Parallel()
	_, err := embedded.Start(embedded.Options{Port: -1})
	require.ErrorContains(t, err, "StoreDir is required")
}

// TestStartOnATakenPort: a second server on the first one's port is
// ErrPortInUse at once (its ReadyTimeout would outlast the test).
func TestStartOnATakenPort(t *testing.T) {
	t.Parallel()
	first, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	defer first.Shutdown()
	u, err := url.Parse(first.ClientURL())
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	_, err = embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: port, ReadyTimeout: time.Hour})
	require.ErrorIs(t, err, embedded.ErrPortInUse)
}
