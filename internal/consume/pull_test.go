package consume_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// workQueue makes on nc a work-queue stream name (subjects <lower
// name>.>) with the durable pull consumer durable (AckWait 30 s).
func workQueue(t *testing.T, nc *nats.Conn, name, durable string) (natsjs.JetStream, natsjs.Consumer) {
	t.Helper()
	js, err := natsjs.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), natsjs.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, Retention: natsjs.WorkQueuePolicy})
	require.NoError(t, err)
	c, err := js.CreateConsumer(t.Context(), name, natsjs.ConsumerConfig{Durable: durable, AckPolicy: natsjs.AckExplicitPolicy, AckWait: 30 * time.Second})
	require.NoError(t, err)
	return js, c
}

// holder is a handler that holds every message until released.
type holder struct {
	mu      sync.Mutex
	running int
	most    int
	done    atomic.Int64
	release chan struct{}
}

func (h *holder) Handle(_ context.Context, d *consume.Delivery) {
	h.mu.Lock()
	h.running++
	h.most = max(h.most, h.running)
	h.mu.Unlock()
	<-h.release
	h.mu.Lock()
	h.running--
	h.mu.Unlock()
	if err := d.Msg.DoubleAck(context.Background()); err == nil {
		h.done.Add(1)
	}
}

func (h *holder) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

// The pool never holds more messages than its slots (no prefetch: the
// consumer shows no more ack-pending than the limit while every handler
// waits), and pulls with few requests: one for a batch of free slots, not
// one per message.
func TestPullAsksOnlyForFreeSlots(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	tap := testenv.Conn(t, srv)
	ctx := t.Context()
	js, c := workQueue(t, nc, "P", "pc")
	var requests atomic.Int64
	sub, err := tap.Subscribe("$JS.API.CONSUMER.MSG.NEXT.P.pc", func(_ *nats.Msg) { requests.Add(1) })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, tap.Flush())

	const limit, total = 8, 200
	for i := range total {
		_, err := js.Publish(ctx, "p."+strconv.Itoa(i), nil)
		require.NoError(t, err)
	}
	h := &holder{release: make(chan struct{})}
	pool := consume.New(nc, limit, false, testenv.Logger(t))
	require.NoError(t, pool.Consume(c, limit, h))
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.running == limit
	}, 10*time.Second, 5*time.Millisecond)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, limit, info.NumAckPending, "messages delivered beyond the free slots")

	close(h.release)
	require.Eventually(t, func() bool { return h.done.Load() == total }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, pool.Stop(ctx))
	h.mu.Lock()
	require.LessOrEqual(t, h.most, limit)
	h.mu.Unlock()
	require.NoError(t, tap.Flush())
	require.Less(t, requests.Load(), int64(total/3), "a pull request per message or two")
}

// A consumer that cannot answer (here: deleted, so every request is
// refused at once with "no responders") is asked again at growing
// intervals, not in a busy loop.
func TestPullBacksOffWhileRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	ctx := t.Context()
	js, c := workQueue(t, nc, "B", "bc")
	pool := consume.New(nc, 4, false, testenv.Logger(t))
	t.Cleanup(func() { _ = pool.Stop(context.Background()) })
	require.NoError(t, pool.Consume(c, 4, &holder{release: make(chan struct{})}))
	require.NoError(t, js.DeleteConsumer(ctx, "B", "bc"))

	// Over a second, a busy loop sends thousands of requests; the pauses
	// (doubling from 20ms) allow fewer than ten (and pause at fetchWait).
	before := nc.Stats().OutMsgs
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	sent := nc.Stats().OutMsgs - before
	require.Less(t, sent, uint64(40), "requests sent in a second while the consumer refuses them")
}

// counting is a holder that counts the messages handed back to it.
type counting struct {
	holder
	released atomic.Int64
}

func (h *counting) Release(msg natsjs.Msg, delay time.Duration) error {
	h.released.Add(1)
	return consume.NakAfter(msg, delay)
}

// A stopping pool hands a message its open pull request received back for
// after that request has ended: the message goes to another worker at its
// next delivery, instead of bouncing between the stopping pool's requests
// and its release until they expire.
func TestStoppingPoolHandsBackPastItsOpenRequests(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	ctx := t.Context()
	nc := testenv.Conn(t, srv)
	js, c := workQueue(t, nc, "S", "sc")

	stopping := &counting{holder: holder{release: make(chan struct{})}}
	a := consume.New(nc, 8, false, testenv.Logger(t))
	require.NoError(t, a.Consume(c, 8, stopping))
	_, err := js.Publish(ctx, "s.1", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		stopping.mu.Lock()
		defer stopping.mu.Unlock()
		return stopping.running == 1
	}, 10*time.Second, time.Millisecond)
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(context.Background()) }()
	require.Eventually(t, a.Stopping, 10*time.Second, time.Millisecond)

	// The stopping pool's request for its other slots is open: it takes
	// this one.
	_, err = js.Publish(ctx, "s.2", nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return stopping.released.Load() > 0 }, 10*time.Second, time.Millisecond)
	other := &holder{release: make(chan struct{})}
	close(other.release)
	b := consume.New(testenv.Conn(t, srv), 2, false, testenv.Logger(t))
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	require.NoError(t, b.Consume(c, 2, other))
	require.Eventually(t, func() bool { return other.done.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the other pool never got it")
	require.Equal(t, int64(1), stopping.released.Load(), "handed back to the stopping pool again")

	close(stopping.release)
	require.NoError(t, <-stopped)
}

// The pull loop parks while it has nothing to do: idle, it wakes about
// once per request it sends; stopping, while its open request runs out, it
// waits for that request's end instead of turning in a loop.
func TestPullLoopParksWhileIdleAndStopping(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	_, c := workQueue(t, nc, "I", "ic")
	pool := consume.New(nc, 4, false, testenv.Logger(t))
	require.NoError(t, pool.Consume(c, 4, &holder{release: make(chan struct{})}))
	// Idle for as long as a request stays open, then stopped: the loop
	// sees its request expire and waits for the last one after Stop (at
	// most a request's life each), a few turns in all. A busy loop turns
	// millions of times in that time.
	idle := time.Now()
	require.Eventually(t, func() bool { return pool.Turns() > 0 }, 10*time.Second, time.Millisecond)
	for time.Since(idle) < time.Second {
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	require.NoError(t, pool.Stop(t.Context()))
	elapsed := time.Since(idle)
	// One turn per request's end (each within fetchWait) and a handful for
	// the stop itself.
	limit := 10 + 2*int64(elapsed/time.Second)
	require.LessOrEqual(t, pool.Turns(), limit, "pull loop turns in %v", elapsed)
}
