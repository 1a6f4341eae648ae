package testenv

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"
)

// Tap records every message published on some subjects as a core NATS
// subscriber sees them, in order: a publish the stream refuses (a
// duplicate, a subject already holding its task) is seen too.
type Tap struct {
	t    testing.TB
	sync string // <prefix>.<n>: this tap's sync subjects
	mu   sync.Mutex
	msgs []*nats.Msg
	ch   chan string
}

// NewTap subscribes sub (a connection of the tap's own) to subjects. All
// its subscriptions feed one channel from the connection's read loop, in
// the order the server sent them (separate callbacks would each run on a
// goroutine of their own, in no order across subscriptions), so that a
// sync message comes after every message the server sent before it.
func NewTap(t testing.TB, sub *nats.Conn, subjects ...string) *Tap {
	t.Helper()
	tp := &Tap{t: t, sync: "tap.sync." + nuid.Next(), ch: make(chan string, 16)}
	all := make(chan *nats.Msg, 1<<16)
	for _, subject := range append([]string{tp.sync + ".*"}, subjects...) {
		s, err := sub.ChanSubscribe(subject, all)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Unsubscribe() })
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case m := <-all:
				if strings.HasPrefix(m.Subject, tp.sync+".") {
					select {
					case tp.ch <- m.Subject:
					case <-done:
						return
					}
					continue
				}
				tp.mu.Lock()
				tp.msgs = append(tp.msgs, m)
				tp.mu.Unlock()
			}
		}
	}()
	require.NoError(t, sub.Flush())
	return tp
}

// Seen returns the messages the tap has seen so far: every one published
// on the connections pubs before the call is among them (the server keeps
// each connection's publishes in order, and the tap waits for a message
// each of them publishes last).
func (tp *Tap) Seen(pubs ...*nats.Conn) []*nats.Msg {
	tp.t.Helper()
	for _, pub := range pubs {
		want := tp.sync + "." + nuid.Next()
		require.NoError(tp.t, pub.Publish(want, nil))
		require.NoError(tp.t, pub.Flush())
		for got := ""; got != want; {
			select {
			case got = <-tp.ch:
			case <-time.After(10 * time.Second):
				tp.t.Fatal("the tap did not see its sync message")
			}
		}
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return slices.Clone(tp.msgs)
}
