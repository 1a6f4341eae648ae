// Package jetstream is jetflow's only door to NATS: it starts the embedded
// server, connects, provisions the streams, consumers and KV buckets the
// engine needs, and wraps the few JetStream operations whose error codes
// decide correctness (create-if-absent, compare-and-set, deduplicated
// publish) so that every other package matches typed errors instead of raw
// NATS codes.
package jetstream

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// EmbeddedConfig configures the in-process nats-server.
type EmbeddedConfig struct {
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

// Embedded is a running in-process nats-server with JetStream.
type Embedded struct {
	cfg EmbeddedConfig
	srv *server.Server
}

// ErrServerNotReady is returned when the embedded server did not become
// ready for connections in time.
var ErrServerNotReady = errors.New("jetflow: embedded NATS server not ready")

// ErrPortInUse is returned at once when the embedded server's address is
// taken (by another worker's embedded server, a NATS server, or any other
// process); match it with errors.Is on a *PortInUseError.
var ErrPortInUse = errors.New("address already in use")

// PortInUseError is StartEmbedded's error for an address another process
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

// StartEmbedded starts a nats-server with JetStream and file storage under
// cfg.DataDir and waits until it accepts connections and JetStream is
// enabled.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
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
	e := &Embedded{cfg: cfg}
	if err := e.start(); err != nil {
		return nil, err
	}
	// Pin the port that was picked, so Restart comes back on the same
	// address and clients can reconnect.
	e.cfg.Port = e.srv.Addr().(*net.TCPAddr).Port
	return e, nil
}

func (e *Embedded) start() error {
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
		return fmt.Errorf("%w after %s (listening on %s:%d)", ErrServerNotReady, e.cfg.ReadyTimeout, e.cfg.Host, e.cfg.Port)
	}
	deadline := time.Now().Add(e.cfg.ReadyTimeout)
	for !srv.JetStreamEnabled() {
		if time.Now().After(deadline) {
			srv.Shutdown()
			return fmt.Errorf("%w: JetStream not enabled after %s", ErrServerNotReady, e.cfg.ReadyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.srv = srv
	return nil
}

// ClientURL is the nats:// URL other processes connect to.
func (e *Embedded) ClientURL() string {
	return "nats://" + net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.Port))
}

// Connect opens a client connection to the embedded server that reconnects
// forever, so it survives Restart.
func (e *Embedded) Connect(name string) (*nats.Conn, error) {
	return Connect(e.ClientURL(), name)
}

// Clients is the number of client connections the server holds now.
func (e *Embedded) Clients() int {
	if e.srv == nil {
		return 0
	}
	return e.srv.NumClients()
}

// Shutdown stops the server and waits for it to finish. Stored data stays in
// DataDir.
func (e *Embedded) Shutdown() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
}

// WaitForShutdown blocks until the server has shut down.
func (e *Embedded) WaitForShutdown() {
	if e.srv != nil {
		e.srv.WaitForShutdown()
	}
}

// Restart shuts the server down and starts it again on the same address and
// data directory, as a process restart would.
func (e *Embedded) Restart() error {
	e.Shutdown()
	return e.start()
}

// Connect dials url with ConnOptions, named name, followed by extra.
func Connect(url, name string, extra ...nats.Option) (*nats.Conn, error) {
	opts := append(append([]nats.Option{nats.Name(name)}, ConnOptions()...), extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("jetflow: connect to %s: %w", url, err)
	}
	return nc, nil
}

// ConnOptions are the connection settings of every connection jetflow
// opens (Connect, jetflow.Connect, the commands'), suited to a long-lived
// engine process: unlimited reconnects, so that a NATS restart is
// survived, and no reconnect buffer: a write attempted while disconnected
// fails at once instead of being sent after the reconnect, long after its
// caller gave up on it and acted on that (a late commit would land behind
// a retry's). UnsafeOption checks a connection for the second.
func ConnOptions() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectBufSize(-1),
	}
}

// UnsafeOption describes the setting of a connection with options o that
// breaks the engine's ordering guarantees, or returns "" when there is
// none: a reconnect buffer (nats.ReconnectBufSize not negative, on a
// connection that reconnects), which holds writes made while disconnected
// and sends them after the reconnect.
func UnsafeOption(o nats.Options) string {
	if o.AllowReconnect && o.ReconnectBufSize >= 0 {
		size := o.ReconnectBufSize
		if size == 0 {
			size = nats.DefaultReconnectBufSize
		}
		return fmt.Sprintf("its reconnect buffer is on (nats.ReconnectBufSize %d)", size)
	}
	return ""
}
