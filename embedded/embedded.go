// Package embedded runs a NATS server with JetStream inside the process,
// for development, tests and single-node deployments: what cmd/worker
// starts when it is given no --nats-url.
//
// # Starting and connecting
//
//	srv, err := embedded.Start(embedded.Options{StoreDir: "./jetflow-data", Port: -1})
//	if err != nil { ... }
//	defer srv.Shutdown()
//	nc, err := jetflow.Connect(srv.ClientURL())
//
// Connect with jetflow.Connect, which sets the connection options jetflow's
// guarantees need; jetflow.NewWorker and jetflow.NewClient refuse a
// connection without them (jetflow.ErrUnsafeConnection).
//
// # Durability
//
// The server keeps JetStream's file store in StoreDir, so runs survive a
// restart of the process. By default the store syncs to disk every two
// minutes: an acknowledged write survives a process crash, not an OS crash;
// SyncAlways makes it survive both, at a large cost in throughput. For more
// than one node, or authentication and TLS, run a NATS deployment and
// connect to it instead.
package embedded

import (
	"errors"
	"time"

	"github.com/jetflow/jetflow/internal/natsserver"
)

// ErrNotReady: the server did not accept connections, or did not enable
// JetStream, within Options.ReadyTimeout.
var ErrNotReady = natsserver.ErrNotReady

// ErrPortInUse: another process (another embedded server, a NATS server)
// listens on Options.Host and Options.Port. Start reports it at once,
// without waiting for ReadyTimeout; choose another Port, or -1 for a free
// one.
var ErrPortInUse = natsserver.ErrPortInUse

// Options configure Start. StoreDir is required; the other zero fields take
// their defaults.
type Options struct {
	// StoreDir is the directory of JetStream's file store. Required.
	StoreDir string
	// Host is the address to listen on (default 127.0.0.1, so that other
	// local processes can connect; "0.0.0.0" for every interface).
	Host string
	// Port is the port to listen on: 0 is the NATS default 4222, -1 picks a
	// free one (read it from ClientURL).
	Port int
	// SyncAlways makes the store fsync every write (see Durability).
	SyncAlways bool
	// ServerName names the server (default "jetflow").
	ServerName string
	// ReadyTimeout bounds the wait for the server to be ready (default 10s).
	ReadyTimeout time.Duration
}

// Server is a running embedded NATS server with JetStream.
type Server struct {
	e *natsserver.Server
}

// Start starts a server and waits until it accepts connections with
// JetStream enabled. Call Shutdown when done; the data stays in StoreDir.
// A taken address is ErrPortInUse at once.
func Start(opts Options) (*Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("jetflow: embedded server: Options.StoreDir is required")
	}
	e, err := natsserver.Start(natsserver.Config{
		DataDir:      opts.StoreDir,
		Host:         opts.Host,
		Port:         opts.Port,
		SyncAlways:   opts.SyncAlways,
		ServerName:   opts.ServerName,
		ReadyTimeout: opts.ReadyTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &Server{e: e}, nil
}

// ClientURL is the nats:// URL clients connect to, with the port that was
// picked when Options.Port was -1.
func (s *Server) ClientURL() string { return s.e.ClientURL() }

// Shutdown stops the server and waits until it has stopped. Connections to
// it are closed by the server; their clients see a disconnection. Calling it
// again does nothing.
func (s *Server) Shutdown() { s.e.Shutdown() }

// WaitForShutdown blocks until the server has shut down (Shutdown was
// called).
func (s *Server) WaitForShutdown() { s.e.WaitForShutdown() }
