// Package consume runs handlers over JetStream pull consumers with bounded
// concurrency: tasks (internal/workflow) and durable start envelopes
// (internal/startproto) are consumed the same way.
//
// Its promise is the one a live worker owes the others: a message this
// process holds is never redelivered to another process while this one is
// alive and not stalled. Three rules keep it:
//
//   - it pulls only as many messages as it has free slots for, so nothing
//     waits un-heartbeated in a client buffer (no prefetch);
//   - from the moment a message is received until it is settled, its ack
//     deadline is extended every third of the consumer's AckWait, also while
//     it waits for a slot the pool shares between consumers;
//   - the AckWait it extends against is the consumer's, the deployment's
//     setting, re-read while the pool runs (see jetstream.EffectiveAckWait),
//     not the one this process was started with.
//
// A message fetched but not started when the pool stops is handed back
// (Handler.Release); Stop drains within a deadline.
package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// stuckGrace is how long Stop still waits, after cancelling the running
// steps' contexts, for steps and workflow bodies that ignore cancellation.
const stuckGrace = 5 * time.Second

// fetchWait is how long one pull request waits on the server for messages.
// It bounds how long Stop waits for pulls in flight (whose messages are
// handed back, never dropped in transit), and costs one request per
// consumer per fetchWait while idle.
const fetchWait = time.Second

// Handler processes and settles messages.
type Handler interface {
	// Handle processes d's message and settles it (ack, nak, term). ctx is
	// cancelled when the pool's drain deadline passes.
	Handle(ctx context.Context, d *Delivery)
	// Release hands back a message that was fetched but never handled,
	// to be delivered again after delay (0: at once). A stopping pool
	// asks for the time its own pull requests stay open, so that the
	// message goes to another worker rather than back to this one.
	Release(msg natsjs.Msg, delay time.Duration) error
}

// Delivery is a message a handler holds. The pool extends its ack
// deadline every third of the consumer's AckWait until the handler
// returns; the handler may hook its own renewal onto those beats (OnBeat)
// and stop them early (Stop), when the message is no longer its own.
type Delivery struct {
	Msg natsjs.Msg
	// Received is when the pool received the message: its ack deadline
	// runs from then.
	Received time.Time

	src     *source
	mu      sync.Mutex
	onBeat  func()
	stopped bool
}

// AckWait is the consumer's effective AckWait now: how long the broker
// waits after the last extension before it redelivers the message.
func (d *Delivery) AckWait() time.Duration { return time.Duration(d.src.ackWait.Load()) }

// HandBackDelay is how long a message handed back by this pool should wait
// before it is delivered again: while the pool stops, until the last pull
// request it sent expires (else the broker hands the message straight back
// to one of them, and a worker that drains bounces it to itself until
// they end); otherwise 0.
func (d *Delivery) HandBackDelay() time.Duration { return d.src.pool.handBackDelay() }

// OnBeat makes every later heartbeat call f after it extended the
// message's deadline (nil: nothing). f runs on the heartbeat's goroutine;
// the next beat waits for it.
func (d *Delivery) OnBeat(f func()) {
	d.mu.Lock()
	d.onBeat = f
	d.mu.Unlock()
}

// Stop ends the heartbeats of the message before the handler returns: it
// is no longer the handler's to keep alive (another delivery owns it, or
// it was settled). A repeat call does nothing.
func (d *Delivery) Stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
}

// beat extends the deadline (unless extend is false) and calls the
// handler's hook, unless stopped.
func (d *Delivery) beat(extend bool, log zerolog.Logger) {
	d.mu.Lock()
	stopped, f := d.stopped, d.onBeat
	d.mu.Unlock()
	if stopped {
		return
	}
	if extend {
		if err := d.Msg.InProgress(); err != nil && !errors.Is(err, natsjs.ErrMsgAlreadyAckd) {
			log.Warn().Err(err).Str("subject", d.Msg.Subject()).Msg("cannot extend ack deadline")
		}
	}
	if f != nil {
		f()
	}
}

// Pool consumes messages from consumers and hands them to their handlers
// with bounded concurrency.
type Pool struct {
	nc *nats.Conn
	// batches: a request for a few free slots waits batchDelay for more
	// (every pool but those of one slot).
	batches     bool
	log         zerolog.Logger
	sem         chan struct{} // running handlers, across consumers
	noHeartbeat bool
	inFlight    atomic.Int64

	mu      sync.Mutex
	sources []*source

	stopping atomic.Bool
	quit     chan struct{} // closed when Stop begins
	// lastRequest is when the pool sent its latest pull request (Unix
	// nanoseconds): it is open on the server until fetchWait after that.
	lastRequest atomic.Int64
	loops       sync.WaitGroup
	handlers    sync.WaitGroup

	// hard is cancelled when the drain deadline passes: running steps see
	// their context cancelled and their tasks are released.
	hard       context.Context
	hardCancel context.CancelFunc
}

// source is one consumer the pool pulls from.
type source struct {
	pool *Pool
	c    natsjs.Consumer
	h    Handler
	// own holds a token per message of this consumer that is fetched or
	// requested and not yet settled: at most its limit.
	own chan struct{}
	// ackWait is the consumer's effective AckWait (nanoseconds), followed
	// while the pool runs.
	ackWait atomic.Int64
	// freed tells the pull loop that a slot was freed.
	freed chan struct{}
	// turns counts the pull loop's waits (the tests' check that it parks).
	turns atomic.Int64
}

// free gives back a settled message's slot and tells the pull loop.
func (s *source) free() {
	<-s.own
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

func (s *source) beatEvery() time.Duration {
	return max(time.Duration(s.ackWait.Load())/3, time.Millisecond)
}

// New returns a pool running at most concurrency handlers at once, pulling
// on nc. noHeartbeat (tests only) disables ack-deadline extension.
func New(nc *nats.Conn, concurrency int, noHeartbeat bool, log zerolog.Logger) *Pool {
	hard, cancel := context.WithCancel(context.Background())
	p := &Pool{nc: nc, batches: concurrency > 1, log: log, sem: make(chan struct{}, concurrency), noHeartbeat: noHeartbeat,
		quit: make(chan struct{}), hard: hard, hardCancel: cancel}
	p.loops.Add(1)
	go p.follow()
	return p
}

// Consume starts pulling from c into h, holding at most limit of its
// messages at once (limit <= 0 or above the pool's concurrency: the pool's
// concurrency). Handlers of all consumers share the pool's concurrency; a
// message that waits for a slot is heartbeated meanwhile.
func (p *Pool) Consume(c natsjs.Consumer, limit int, h Handler) error {
	if limit <= 0 || limit > cap(p.sem) {
		limit = cap(p.sem)
	}
	if p.stopping.Load() {
		return errors.New("jetflow: pool is stopping")
	}
	s := &source{pool: p, c: c, h: h, own: make(chan struct{}, limit), freed: make(chan struct{}, 1)}
	s.ackWait.Store(int64(jetstream.EffectiveAckWait(c.CachedInfo().Config)))
	p.mu.Lock()
	p.sources = append(p.sources, s)
	p.mu.Unlock()
	p.loops.Add(1)
	go p.pull(s)
	return nil
}

// start runs one received message: its ack deadline is extended from now
// on, while it waits for a slot and while its handler runs. It gives back
// the message's slot of s when the handler returns.
func (p *Pool) start(s *source, msg natsjs.Msg, stopping bool) {
	d := &Delivery{Msg: msg, Received: time.Now(), src: s}
	stopBeat := p.heartbeat(s, d)
	if stopping || p.stopping.Load() {
		// Handed back under heartbeat too: Release records the unstarted
		// attempt first, which may take a while if NATS is slow.
		p.release(msg, s.h)
		stopBeat()
		s.free()
		return
	}
	p.handlers.Add(1)
	go func() {
		defer p.handlers.Done()
		defer s.free()
		defer stopBeat()
		select {
		case p.sem <- struct{}{}:
		case <-p.quit:
			p.release(msg, s.h)
			return
		}
		defer func() { <-p.sem }()
		if p.stopping.Load() { // Stop began while this message waited for a slot
			p.release(msg, s.h)
			return
		}
		p.inFlight.Add(1)
		defer p.inFlight.Add(-1)
		s.h.Handle(p.hard, d)
	}()
}

// heartbeat extends d's ack deadline every third of s's current AckWait
// until the returned stop is called (without extending it when the pool
// was made with noHeartbeat, a test's stalled worker: the handler's hook
// still runs).
func (p *Pool) heartbeat(s *source, d *Delivery) (stop func()) {
	return heartbeat(s.beatEvery, func() { d.beat(!p.noHeartbeat, p.log) })
}

// follow re-reads the consumers' AckWait, each every
// jetstream.AckWaitRefresh of its current value, so that heartbeats keep
// pace with the deployment's setting when an operator changes it.
func (p *Pool) follow() {
	defer p.loops.Done()
	tick := time.NewTicker(followTick)
	defer tick.Stop()
	due := map[*source]time.Time{}
	for {
		select {
		case <-tick.C:
		case <-p.quit:
			return
		}
		p.mu.Lock()
		sources := append([]*source(nil), p.sources...)
		p.mu.Unlock()
		for _, s := range sources {
			every := jetstream.AckWaitRefresh(time.Duration(s.ackWait.Load()))
			if next, ok := due[s]; !ok {
				due[s] = time.Now().Add(every)
				continue
			} else if time.Now().Before(next) {
				continue
			}
			due[s] = time.Now().Add(every)
			ctx, cancel := context.WithTimeout(context.Background(), every)
			info, err := s.c.Info(ctx)
			cancel()
			if err != nil {
				continue // the value read last stands; NATS trouble is reported by pulls
			}
			now := jetstream.EffectiveAckWait(info.Config)
			if old := time.Duration(s.ackWait.Swap(int64(now))); old != now {
				p.log.Info().Str("consumer", info.Name).Str("ack_wait", now.String()).Str("was", old.String()).
					Msg("consumer AckWait changed; heartbeats follow it")
			}
		}
	}
}

// followTick is the resolution of follow's schedule.
const followTick = 50 * time.Millisecond

// release hands a message that was fetched but not started back at once.
func (p *Pool) release(msg natsjs.Msg, h Handler) {
	if err := h.Release(msg, p.handBackDelay()); err != nil {
		p.log.Warn().Err(err).Msg("cannot release buffered message")
	}
}

// NakAfter hands msg back to be delivered again after delay (0: at once).
func NakAfter(msg natsjs.Msg, delay time.Duration) error {
	if delay > 0 {
		return msg.NakWithDelay(delay)
	}
	return msg.Nak()
}

// handBackDelay is Delivery.HandBackDelay.
func (p *Pool) handBackDelay() time.Duration {
	if !p.stopping.Load() {
		return 0
	}
	open := time.Until(time.Unix(0, p.lastRequest.Load()).Add(fetchWait))
	return max(open, 0) + handBackMargin
}

// handBackMargin covers the way from the server's expiry of a pull request
// to its end: a message handed back by a stopping pool returns this much
// after its last request ended.
const handBackMargin = 50 * time.Millisecond

// Stopping reports whether Stop has begun: from then on no new message is
// started.
func (p *Pool) Stopping() bool { return p.stopping.Load() }

// InFlight is the number of messages being handled.
func (p *Pool) InFlight() int { return int(p.inFlight.Load()) }

// Stop stops pulling, hands back messages that were received but not
// started (including those of pull requests still open, which it waits
// for), and waits for running handlers to finish and settle. When ctx ends
// first, running handlers get their context cancelled (steps are released,
// not committed); Stop waits a short grace for that and returns an error
// (ctx's, and how many handlers ignored the cancellation: their messages are
// redelivered after the ack deadline). A second call returns at once.
func (p *Pool) Stop(ctx context.Context) error {
	if p.stopping.Swap(true) {
		return nil
	}
	close(p.quit)
	done := make(chan struct{})
	go func() {
		p.loops.Wait()
		p.handlers.Wait()
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
	return heartbeat(func() time.Duration { return every }, beat)
}

// heartbeat is Heartbeat with an interval read again before every wait.
func heartbeat(every func() time.Duration, beat func()) (stop func()) {
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
			t.Reset(every())
		}
	}
	mu.Lock()
	t = time.AfterFunc(every(), tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
