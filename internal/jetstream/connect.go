// Package jetstream is jetflow's only door to NATS: it connects,
// provisions the streams, consumers and KV buckets the engine needs, and
// wraps the few JetStream operations whose error codes decide correctness
// (create-if-absent, compare-and-set, deduplicated publish) so that every
// other package matches typed errors instead of raw NATS codes. (The
// embedded server is internal/natsserver's.)
package jetstream

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

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
