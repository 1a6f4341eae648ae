package opshttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Server timeouts of NewServer. There is no write timeout: the producer's
// API shares the server and its wait endpoint long-polls, so handlers bound
// their own work with their request's context.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	IdleTimeout       = 120 * time.Second
	// ShutdownTimeout is how long Serve waits for in-flight requests after
	// its context is done before closing their connections: longer than a
	// start or read against NATS may take (10s by default in the API).
	ShutdownTimeout = 20 * time.Second
	maxHeaderBytes  = 64 << 10
)

// Listen binds a TCP listener on addr (":0" picks a free port; read it
// from the listener's Addr) for Serve.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("opshttp: listen on %q: %w", addr, err)
	}
	return ln, nil
}

// Serve serves h on ln with the timeouts above until ctx is done, then
// shuts down gracefully: it stops accepting, waits up to ShutdownTimeout
// for in-flight requests and closes what is left. It returns nil after a
// shutdown that ctx asked for, and the server's error when serving fails
// first. Serve always closes ln.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	return ServeGrace(ctx, ln, h, ShutdownTimeout)
}

// NewServer returns the http.Server that Serve and ServeGrace serve h
// with: the one server of the commands' HTTP endpoints (producer serve's
// API and operations endpoints, the worker's operations endpoints), with
// the timeouts above. The HTTP benchmark serves the API through it too, so
// that it measures what production runs.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// ServeGrace is Serve with its own shutdown grace: how long requests in
// flight when ctx ends may take to finish (at least ShutdownTimeout).
func ServeGrace(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration) error {
	srv := NewServer(h)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("opshttp: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(grace, ShutdownTimeout))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return errors.Join(fmt.Errorf("opshttp: shutdown: %w", err), srv.Close())
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("opshttp: serve: %w", err)
	}
	return nil
}

// NewRegistry returns a registry with the Go runtime and process
// collectors, for a command's /metrics; jetflow.NewMetrics adds jetflow's.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// CheckAddr accepts a listen address host:port with a port in 0..65535
// (0 picks a free one), for validating a flag before anything listens.
func CheckAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("want a port number 0..65535")
	}
	return nil
}
