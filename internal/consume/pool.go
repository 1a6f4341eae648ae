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
	// Handle processes msg and settles it (ack, nak, term). ctx is
	// cancelled when the pool's drain deadline passes.
	Handle(ctx context.Context, msg natsjs.Msg)
	// Release hands back a message that was fetched but never handled.
	Release(msg natsjs.Msg) error
}

// Pool consumes messages from consumers and hands them to their handlers
// with bounded concurrency.
type Pool struct {
	log         zerolog.Logger
	sem         chan struct{} // running handlers, across consumers
	noHeartbeat bool
	inFlight    atomic.Int64

	mu      sync.Mutex
	sources []*source

	stopping atomic.Bool
	quit     chan struct{} // closed when Stop begins
	loops    sync.WaitGroup
	handlers sync.WaitGroup

	// hard is cancelled when the drain deadline passes: running steps see
	// their context cancelled and their tasks are released.
	hard       context.Context
	hardCancel context.CancelFunc
}

// source is one consumer the pool pulls from.
type source struct {
	c natsjs.Consumer
	h Handler
	// own holds a token per message of this consumer that is fetched or
	// requested and not yet settled: at most its limit.
	own chan struct{}
	// ackWait is the consumer's effective AckWait (nanoseconds), followed
	// while the pool runs.
	ackWait atomic.Int64
}

func (s *source) beatEvery() time.Duration {
	return max(time.Duration(s.ackWait.Load())/3, time.Millisecond)
}

// New returns a pool running at most concurrency handlers at once.
// noHeartbeat (tests only) disables ack-deadline extension.
func New(concurrency int, noHeartbeat bool, log zerolog.Logger) *Pool {
	hard, cancel := context.WithCancel(context.Background())
	p := &Pool{log: log, sem: make(chan struct{}, concurrency), noHeartbeat: noHeartbeat,
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
	s := &source{c: c, h: h, own: make(chan struct{}, limit)}
	s.ackWait.Store(int64(jetstream.EffectiveAckWait(c.CachedInfo().Config)))
	p.mu.Lock()
	p.sources = append(p.sources, s)
	p.mu.Unlock()
	p.loops.Add(1)
	go p.pull(s)
	return nil
}

// pull requests as many messages as s has free slots, whenever it has one.
// Several pull requests may be open at once; each holds the slots it asked
// for until it ends.
func (p *Pool) pull(s *source) {
	defer p.loops.Done()
	for {
		select {
		case s.own <- struct{}{}:
		case <-p.quit:
			return
		}
		if p.stopping.Load() { // both were ready: never pull after Stop began
			<-s.own
			return
		}
		n := 1
	more:
		for n < cap(s.own) {
			select {
			case s.own <- struct{}{}:
				n++
			default:
				break more
			}
		}
		batch, err := s.c.Fetch(n, natsjs.FetchMaxWait(fetchWait))
		p.loops.Add(1)
		go p.receive(s, batch, err, n)
	}
}

// receive starts the messages of one pull request and gives back the slots
// it did not fill. A pull that failed without a message (NATS unavailable,
// a leader change) keeps its slots for a short pause, so that pulling does
// not spin.
func (p *Pool) receive(s *source, batch natsjs.MessageBatch, err error, slots int) {
	defer p.loops.Done()
	got := 0
	if err == nil {
		for msg := range batch.Messages() {
			got++
			p.start(s, msg)
		}
		err = batch.Error()
	}
	if err != nil && got == 0 && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, natsjs.ErrNoMessages) {
		if !p.stopping.Load() {
			p.log.Warn().Err(err).Str("consumer", s.c.CachedInfo().Name).Msg("cannot pull tasks; retrying")
		}
		select {
		case <-time.After(fetchWait):
		case <-p.quit:
		}
	}
	for range slots - got {
		<-s.own
	}
}

// start runs one received message: its ack deadline is extended from now
// on, while it waits for a slot and while its handler runs. It gives back
// the message's slot of s when the handler returns.
func (p *Pool) start(s *source, msg natsjs.Msg) {
	stopBeat := p.heartbeat(s, msg)
	if p.stopping.Load() {
		// Handed back under heartbeat too: Release records the unstarted
		// attempt first, which may take a while if NATS is slow.
		p.release(msg, s.h)
		stopBeat()
		<-s.own
		return
	}
	p.handlers.Add(1)
	go func() {
		defer p.handlers.Done()
		defer func() { <-s.own }()
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
		s.h.Handle(p.hard, msg)
	}()
}

// heartbeat extends msg's ack deadline every third of s's current AckWait
// until the returned stop is called.
func (p *Pool) heartbeat(s *source, msg natsjs.Msg) (stop func()) {
	if p.noHeartbeat {
		return func() {}
	}
	return heartbeat(s.beatEvery, func() {
		if err := msg.InProgress(); err != nil && !errors.Is(err, natsjs.ErrMsgAlreadyAckd) {
			p.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("cannot extend ack deadline")
		}
	})
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
	if err := h.Release(msg); err != nil {
		p.log.Warn().Err(err).Msg("cannot release buffered message")
	}
}

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
