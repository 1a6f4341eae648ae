package jetflowtest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
)

// proc is one worker "process" of an Env: a worker on a connection of its
// own, dialled through a kill switch, so that a simulated crash cuts the
// socket as a SIGKILL would, and a log that falls silent when the process
// dies.
type proc struct {
	name   string
	nc     *nats.Conn
	w      *jetflow.Worker
	sock   *killSwitch
	log    *silencer
	killed sync.Once
}

// dial connects p's worker to url through p's kill switch.
func (p *proc) dial(url string) error {
	p.sock = &killSwitch{}
	nc, err := jetstream.Connect(url, p.name, nats.SetCustomDialer(p.sock))
	if err != nil {
		return err
	}
	p.nc = nc
	return nil
}

// kill closes p's sockets before its connection, so that what the
// connection has buffered (acks, heartbeats, publishes of other steps) is
// lost, not flushed, and it dials nothing again. Its log falls silent. It
// reports whether this call killed p (a second one does nothing).
func (p *proc) kill() bool {
	killed := false
	p.killed.Do(func() {
		killed = true
		p.log.off()
		p.sock.kill()
		p.nc.Close()
	})
	return killed
}

// dead reports whether p was killed.
func (p *proc) dead() bool { return p.sock.isDead() }

// killSwitch dials TCP connections and closes them all at kill; after
// that, it dials nothing.
type killSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

var errKilled = errors.New("jetflowtest: the worker was killed")

// Dial implements nats.CustomDialer.
func (k *killSwitch) Dial(network, address string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errKilled
	}
	c, err := net.Dial(network, address)
	if err == nil {
		k.conns = append(k.conns, c)
	}
	return c, err
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close() // the process is gone: a socket that was already closed says nothing more
	}
}

func (k *killSwitch) isDead() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

// silencer forwards writes until it is turned off, then drops them: the
// log of a killed worker, whose goroutines may outlive the test, must not
// write to the test's log after the test ended.
type silencer struct {
	w       io.Writer
	silence atomic.Bool
}

func (s *silencer) Write(b []byte) (int, error) {
	if s.silence.Load() {
		return len(b), nil
	}
	return s.w.Write(b)
}

func (s *silencer) off() {
	if s != nil {
		s.silence.Store(true)
	}
}

// procKey is the context key of the proc that runs a step.
type procKey struct{}

// withProc is ctx of a step that p runs.
func withProc(ctx context.Context, p *proc) context.Context {
	return context.WithValue(ctx, procKey{}, p)
}

// killedStep reports whether ctx is a step's whose worker was killed: what
// it still does happens in a process that no longer exists.
func killedStep(ctx context.Context) bool {
	p, ok := ctx.Value(procKey{}).(*proc)
	return ok && p.dead()
}
