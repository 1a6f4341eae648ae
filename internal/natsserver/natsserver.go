// Package natsserver runs a nats-server with JetStream in the process: the
// one package of jetflow that imports nats-server, so that a program that
// only defines and runs workflows against a NATS deployment does not build
// it. The public package embedded, the worker command's default, tests and
// the benchmarks start their servers here.
package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures the in-process nats-server.
type Config struct {
	// DataDir is where JetStream keeps its file store. Required.
	DataDir string
	// Host to listen on; default 127.0.0.1 so that other local processes
	// (the producer CLI, more workers) can connect.
	Host string
	// Port to listen on; 0 picks the NATS default 4222, -1 a free port.
	Port int
	// SyncAlways makes the file store fsync every write, so an acknowledged
	// write survives an OS crash, at a large cost in throughput. By default
	// the store syncs every two minutes: writes survive a process crash.
	SyncAlways bool
	// ServerName defaults to "jetflow".
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept connections;
	// default 10s.
	ReadyTimeout time.Duration
}

// Server is a running in-process nats-server with JetStream.
type Server struct {
	cfg Config
	srv *server.Server
}

// ErrNotReady is returned when the embedded server did not become
// ready for connections in time.
var ErrNotReady = errors.New("jetflow: embedded NATS server not ready")

// ErrPortInUse is returned at once when the embedded server's address is
// taken (by another worker's embedded server, a NATS server, or any other
// process); match it with errors.Is on a *PortInUseError.
var ErrPortInUse = errors.New("address already in use")

// PortInUseError is Start's error for an address another process
// listens on.
type PortInUseError struct {
	Host string
	Port int
	Err  error // the listen error
}

// Error reads "jetflow: embedded server: 127.0.0.1:4222: address already
// in use (another worker's embedded NATS server, a NATS server or another
// process listens there)".
func (e *PortInUseError) Error() string {
	return fmt.Sprintf("jetflow: embedded server: %s: %v (another worker's embedded NATS server, a NATS server or another process listens there)",
		net.JoinHostPort(e.Host, strconv.Itoa(e.Port)), ErrPortInUse)
}

// Unwrap returns ErrPortInUse and the listen error.
func (e *PortInUseError) Unwrap() []error { return []error{ErrPortInUse, e.Err} }

// checkPort fails with a *PortInUseError when host:port cannot be listened
// on because it is taken, and with the listen error for any other reason
// (a host that is no local address).
// nats-server itself only logs such a failure and never becomes ready, so
// without this check a taken port is a ReadyTimeout wait and a vague error.
func checkPort(host string, port int) error {
	if port <= 0 {
		return nil // a free port is picked
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return &PortInUseError{Host: host, Port: port, Err: err}
	}
	if err != nil {
		return fmt.Errorf("jetflow: embedded server: %w", err)
	}
	if err := ln.Close(); err != nil {
		return fmt.Errorf("jetflow: embedded server: probe %s:%d: %w", host, port, err)
	}
	return nil
}

// Start starts a nats-server with JetStream and file storage under
// cfg.DataDir and waits until it accepts connections and JetStream is
// enabled.
func Start(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("jetflow: embedded server: DataDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = 4222
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "jetflow"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	e := &Server{cfg: cfg}
	if err := e.start(); err != nil {
		return nil, err
	}
	// Pin the port that was picked, so Restart comes back on the same
	// address and clients can reconnect.
	e.cfg.Port = e.srv.Addr().(*net.TCPAddr).Port
	return e, nil
}

func (e *Server) start() error {
	if err := checkPort(e.cfg.Host, e.cfg.Port); err != nil {
		return err
	}
	opts := &server.Options{
		ServerName: e.cfg.ServerName,
		Host:       e.cfg.Host,
		Port:       e.cfg.Port,
		JetStream:  true,
		StoreDir:   e.cfg.DataDir,
		NoSigs:     true,
		NoLog:      true,
		SyncAlways: e.cfg.SyncAlways,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("jetflow: embedded server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(e.cfg.ReadyTimeout) {
		srv.Shutdown()
		return fmt.Errorf("%w after %s (listening on %s:%d)", ErrNotReady, e.cfg.ReadyTimeout, e.cfg.Host, e.cfg.Port)
	}
	deadline := time.Now().Add(e.cfg.ReadyTimeout)
	for !srv.JetStreamEnabled() {
		if time.Now().After(deadline) {
			srv.Shutdown()
			return fmt.Errorf("%w: JetStream not enabled after %s", ErrNotReady, e.cfg.ReadyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.srv = srv
	return nil
}

// ClientURL is the nats:// URL other processes connect to.
func (e *Server) ClientURL() string {
	return "nats://" + net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.Port))
}

// Clients is the number of client connections the server holds now.
func (e *Server) Clients() int {
	if e.srv == nil {
		return 0
	}
	return e.srv.NumClients()
}

// Shutdown stops the server and waits for it to finish. Stored data stays in
// DataDir.
func (e *Server) Shutdown() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
}

// WaitForShutdown blocks until the server has shut down.
func (e *Server) WaitForShutdown() {
	if e.srv != nil {
		e.srv.WaitForShutdown()
	}
}

// Restart shuts the server down and starts it again on the same address and
// data directory, as a process restart would.
func (e *Server) Restart() error {
	e.Shutdown()
	return e.start()
}
