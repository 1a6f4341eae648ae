// Package consume runs handlers over JetStream pull consumers with bounded
// concurrency: tasks (internal/workflow) and durable start envelopes
// (internal/dedupe) are consumed the same way. From the moment a message
// arrives until its handler returns, its ack deadline is extended; a
// message fetched but not started when the pool stops is handed back; Stop
// drains within a deadline.
package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// stuckGrace is how long Stop still waits, after cancelling the running
// steps' contexts, for steps and workflow bodies that ignore cancellation.
const stuckGrace = 5 * time.Second

// Handler processes and settles messages.
type Handler interface {
	// Handle processes msg and settles it (ack, nak, term). ctx is
	// cancelled when the pool's drain deadline passes.
	Handle(ctx context.Context, msg natsjs.Msg)
	// Release hands back a message that was fetched but never handled.
	Release(msg natsjs.Msg) error
}

// Pool consumes messages from consumers and hands them to their handlers
// with bounded concurrency. From the moment a message arrives until it is
// settled, its ack deadline is extended every third of the consumer's
// AckWait, so a message waiting for a free slot is not redelivered to
// another process behind the back of this one.
type Pool struct {
	log         zerolog.Logger
	sem         chan struct{}
	wg          sync.WaitGroup
	stopping    atomic.Bool
	running     []natsjs.ConsumeContext
	noHeartbeat bool
	inFlight    atomic.Int64

	// hard is cancelled when the drain deadline passes: running steps see
	// their context cancelled and their tasks are released.
	hard       context.Context
	hardCancel context.CancelFunc
}

// New returns a pool running at most concurrency handlers at once.
// noHeartbeat (tests only) disables ack-deadline extension.
func New(concurrency int, noHeartbeat bool, log zerolog.Logger) *Pool {
	hard, cancel := context.WithCancel(context.Background())
	return &Pool{log: log, sem: make(chan struct{}, concurrency),
		noHeartbeat: noHeartbeat, hard: hard, hardCancel: cancel}
}

// Consume starts pulling from c into h, running at most limit of its
// messages at once within the pool's concurrency (limit <= 0: no limit of
// its own). Prefetch is kept to that size.
func (p *Pool) Consume(c natsjs.Consumer, limit int, h Handler) error {
	if limit <= 0 || limit > cap(p.sem) {
		limit = cap(p.sem)
	}
	// The consumer's AckWait is the deployment's (the last worker to
	// provision it set it), not necessarily this worker's setting.
	every := c.CachedInfo().Config.AckWait / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	own := make(chan struct{}, limit)
	cc, err := c.Consume(func(msg natsjs.Msg) { p.handle(msg, h, own, every) },
		natsjs.PullMaxMessages(limit),
		natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			if !errors.Is(err, natsjs.ErrNoHeartbeat) {
				p.log.Warn().Err(err).Str("consumer", c.CachedInfo().Name).Msg("consumer")
			}
		}))
	if err != nil {
		return err
	}
	p.running = append(p.running, cc)
	return nil
}

func (p *Pool) handle(msg natsjs.Msg, h Handler, own chan struct{}, every time.Duration) {
	if p.stopping.Load() {
		p.release(msg, h)
		return
	}
	stopBeat := func() {}
	if !p.noHeartbeat {
		stopBeat = Heartbeat(every, func() {
			if err := msg.InProgress(); err != nil && !errors.Is(err, natsjs.ErrMsgAlreadyAckd) {
				p.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("cannot extend ack deadline")
			}
		})
	}
	own <- struct{}{}
	p.sem <- struct{}{}
	if p.stopping.Load() { // Stop began while this task waited for a slot
		<-p.sem
		<-own
		stopBeat()
		p.release(msg, h)
		return
	}
	p.wg.Add(1)
	p.inFlight.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { p.inFlight.Add(-1); <-p.sem; <-own }()
		defer stopBeat()
		h.Handle(p.hard, msg)
	}()
}

// release hands a message that was fetched but not started back at once.
func (p *Pool) release(msg natsjs.Msg, h Handler) {
	if err := h.Release(msg); err != nil {
		p.log.Warn().Err(err).Msg("cannot release buffered message")
	}
}

// Stopping reports whether Stop has begun: from then on no new message is
// started.
func (p *Pool) Stopping() bool { return p.stopping.Load() }

// InFlight is the number of messages being handled.
func (p *Pool) InFlight() int { return int(p.inFlight.Load()) }

// Stop stops pulling, releases buffered tasks, and waits for running tasks
// to finish and be acknowledged. When ctx ends first, running steps get
// their context cancelled and their tasks are released (not committed); Stop
// waits a short grace for that and returns an error (ctx's, and how many
// tasks ignored the cancellation: their messages are redelivered after the
// ack deadline). A second call returns at once.
func (p *Pool) Stop(ctx context.Context) error {
	if p.stopping.Swap(true) {
		return nil
	}
	for _, cc := range p.running {
		cc.Drain()
	}
	done := make(chan struct{})
	go func() {
		for _, cc := range p.running {
			<-cc.Closed()
		}
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		p.hardCancel()
		return nil
	case <-ctx.Done():
	}
	p.hardCancel()
	select {
	case <-done:
		return ctx.Err()
	case <-time.After(stuckGrace):
		return fmt.Errorf("%w; %d task(s) ignored cancellation and were abandoned", ctx.Err(), p.InFlight())
	}
}

// Heartbeat calls beat every interval until the returned stop is called.
// It costs a timer, not a goroutine, while nothing is due.
func Heartbeat(every time.Duration, beat func()) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	tick := func() {
		beat()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	}
	mu.Lock()
	t = time.AfterFunc(every, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
