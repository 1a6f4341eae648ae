package jetstream

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
)

// attemptEvery bounds each try of a provisioning request by d.
func attemptEvery(d time.Duration) ProvisionOption {
	return func(p *provisioner) { p.attempt = d }
}

// lossyRelay answers JetStream API requests sent to a plain NATS server
// by forwarding them to a JetStream server, except those drop selects,
// which it swallows unanswered: what a cluster electing its meta leader
// does with a stream or consumer request.
type lossyRelay struct {
	drop func(subject string) bool

	mu      sync.Mutex
	dropped []string
}

// relayedConn starts a JetStream server and a plain one, relays the plain
// one's $JS.API requests through r, and returns a connection to the plain
// one and one to the JetStream server.
func relayedConn(t *testing.T, r *lossyRelay) (front, back *nats.Conn) {
	t.Helper()
	js, err := natsserver.Start(natsserver.Config{DataDir: t.TempDir(), Port: -1})
	require.NoError(t, err)
	t.Cleanup(js.Shutdown)
	plain, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go plain.Start()
	t.Cleanup(plain.Shutdown)
	require.True(t, plain.ReadyForConnections(10*time.Second))

	back, err = Connect(js.ClientURL(), t.Name()+"-back")
	require.NoError(t, err)
	t.Cleanup(back.Close)
	relay, err := Connect(plain.ClientURL(), t.Name()+"-relay")
	require.NoError(t, err)
	t.Cleanup(relay.Close)
	_, err = relay.Subscribe("$JS.API.>", func(m *nats.Msg) {
		r.mu.Lock()
		drop := r.drop(m.Subject)
		if drop {
			r.dropped = append(r.dropped, m.Subject)
		}
		r.mu.Unlock()
		if drop {
			return
		}
		resp, err := back.RequestMsg(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header}, 10*time.Second)
		if err != nil {
			return // the requester times out and tries again
		}
		_ = m.RespondMsg(&nats.Msg{Data: resp.Data, Header: resp.Header})
	})
	require.NoError(t, err)
	require.NoError(t, relay.Flush())
	front, err = Connect(plain.ClientURL(), t.Name()+"-front")
	require.NoError(t, err)
	t.Cleanup(front.Close)
	return front, back
}

// TestProvisionRetriesRequestsNobodyAnswers: the first request for a
// stream, for a bucket and for a consumer gets no answer, as from a
// JetStream cluster without a meta leader. Provision and EnsureConsumer
// try each again once its attempt's bound has passed, and everything is
// provisioned long before the caller's deadline; without the bound, the
// first lost request would have used the caller's whole deadline.
func TestProvisionRetriesRequestsNobodyAnswers(t *testing.T) {
	t.Parallel()
	const attempt = 200 * time.Millisecond
	seen := map[string]bool{}
	r := &lossyRelay{drop: func(subject string) bool {
		for _, first := range []string{"$JS.API.STREAM.INFO.JETFLOW_TASKS", "$JS.API.STREAM.INFO.KV_" + RunsBucket, "$JS.API.CONSUMER.INFO.JETFLOW_TASKS."} {
			if strings.HasPrefix(subject, first) && !seen[first] {
				seen[first] = true
				return true
			}
		}
		return false
	}}
	front, back := relayedConn(t, r)

	c, cancel := context.WithTimeout(context.Background(), 50*attempt)
	defer cancel()
	a, err := Provision(c, front, Topology{}, CreateOrUpdate, attemptEvery(attempt))
	require.NoError(t, err)
	_, err = a.EnsureConsumer(c, "orders", RunTasks, ConsumerConfig{AckWait: time.Second, MaxAckPending: 8})
	require.NoError(t, err)
	require.NoError(t, c.Err(), "provisioned within the deadline")

	r.mu.Lock()
	require.Len(t, r.dropped, 3, "one request of each kind went unanswered: %v", r.dropped)
	r.mu.Unlock()
	direct, err := Provision(ctx(t), back, Topology{}, Ensure)
	require.NoError(t, err, "the JetStream server holds what Provision made")
	_, err = direct.JS.Consumer(ctx(t), TasksStream, ConsumerName("orders", RunTasks))
	require.NoError(t, err)
}
