package jetflow

import (
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
)

// Connect dials the NATS server(s) at url (one URL or a comma-separated
// list) with the connection settings jetflow's guarantees need, followed by
// opts (a name, credentials, TLS, handlers):
//
//   - no reconnect buffer (nats.ReconnectBufSize(-1)): a write attempted
//     while disconnected fails at once, as ErrUnavailable, instead of being
//     sent after the reconnect, long after its caller gave up on it and a
//     retry took over (docs/ARCHITECTURE.md);
//   - unlimited reconnects, 100ms apart, so that a worker survives a NATS
//     restart or a rolling upgrade.
//
// An option in opts that turns the reconnect buffer back on makes Connect
// close the connection and fail with ErrUnsafeConnection. NewWorker and
// NewClient check the same on connections made otherwise. A server that
// cannot be reached gives an error matching ErrUnavailable. The connection
// is the caller's to close.
func Connect(url string, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append(jetstream.ConnOptions(), opts...)...)
	if err != nil {
		return nil, jetstream.Unavailable(fmt.Errorf("jetflow: connect: %w", err))
	}
	if err := checkConn(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// checkConn refuses a nil connection, or one whose settings break the
// guarantees (jetstream.UnsafeOption), with ErrUnsafeConnection and how to
// fix it.
func checkConn(nc *nats.Conn) error {
	if nc == nil {
		return errors.New("jetflow: the NATS connection is nil")
	}
	if what := jetstream.UnsafeOption(nc.Opts); what != "" {
		return fmt.Errorf("%w: %s: writes made while disconnected would be sent after the reconnect, "+
			"out of order with the retries that replaced them; connect with jetflow.Connect, "+
			"or pass nats.ReconnectBufSize(-1) to nats.Connect", ErrUnsafeConnection, what)
	}
	return nil
}

// isZeroLogger reports whether l is the zero zerolog.Logger, which
// discards everything (zerolog.Nop() is not zero).
func isZeroLogger(l zerolog.Logger) bool { return reflect.ValueOf(l).IsZero() }

// defaultLogger is the logger of a WorkerConfig without one: warnings and
// errors to stderr, formatted as the commands format them.
func defaultLogger() zerolog.Logger {
	return logging.New(os.Stderr, logging.DefaultFormat(os.Stderr), zerolog.WarnLevel)
}
