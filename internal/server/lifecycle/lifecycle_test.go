package lifecycle_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/lifecycle"
	"github.com/jetflow/jetflow/internal/server/opshttp"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// TestServeOps: the server outlives ctx and answers until Stop, which
// returns nil; Stop again returns the same at once.
func TestServeOps(t *testing.T) {
	t.Parallel()
	ln, err := opshttp.Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	ops := lifecycle.ServeOps(ctx, ln, http.NotFoundHandler(), func(err error) { t.Errorf("failed: %v", err) })
	cancel()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "still serving after ctx ended")
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.NoError(t, ops.Stop())
	require.NoError(t, ops.Stop())

	require.NoError(t, lifecycle.ServeOps(t.Context(), nil, nil, nil).Stop(), "no listener: nothing served")
}

// TestServeOpsFailure: a server that fails calls failed, and Stop returns
// its error.
func TestServeOpsFailure(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, ln.Close()) // Serve fails at once
	failed := make(chan error, 1)
	ops := lifecycle.ServeOps(t.Context(), ln, http.NotFoundHandler(), func(err error) { failed <- err })
	err = <-failed
	require.True(t, errors.Is(err, net.ErrClosed), "%v", err)
	require.Equal(t, err, ops.Stop())
}
