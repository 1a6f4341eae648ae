package workflow

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Pool consumes task messages from the workflows' consumers and hands them to
// the executor with bounded concurrency.
type Pool struct {
	exec     *Executor
	log      zerolog.Logger
	sem      chan struct{}
	wg       sync.WaitGroup
	stopping atomic.Bool
	running  []natsjs.ConsumeContext

	// hard is cancelled when the drain deadline passes: running steps see
	// their context cancelled and their tasks are released.
	hard       context.Context
	hardCancel context.CancelFunc
}

// NewPool returns a pool running at most concurrency tasks at once.
func NewPool(exec *Executor, concurrency int, log zerolog.Logger) *Pool {
	hard, cancel := context.WithCancel(context.Background())
	return &Pool{exec: exec, log: log, sem: make(chan struct{}, concurrency), hard: hard, hardCancel: cancel}
}

// Consume starts pulling from c, running at most limit of its tasks at once
// within the pool's concurrency (limit <= 0: no limit of its own). Prefetch
// is kept to that size, so a buffered message does not sit out its ack
// deadline behind running ones.
func (p *Pool) Consume(c natsjs.Consumer, limit int) error {
	if limit <= 0 || limit > cap(p.sem) {
		limit = cap(p.sem)
	}
	own := make(chan struct{}, limit)
	cc, err := c.Consume(func(msg natsjs.Msg) { p.handle(msg, own) },
		natsjs.PullMaxMessages(limit),
		natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			if !errors.Is(err, natsjs.ErrNoHeartbeat) {
				p.log.Warn().Err(err).Msg("task consumer")
			}
		}))
	if err != nil {
		return err
	}
	p.running = append(p.running, cc)
	return nil
}

func (p *Pool) handle(msg natsjs.Msg, own chan struct{}) {
	if p.stopping.Load() {
		// Buffered but not started: hand it back at once.
		if err := msg.Nak(); err != nil {
			p.log.Warn().Err(err).Msg("cannot release buffered task")
		}
		return
	}
	own <- struct{}{}
	p.sem <- struct{}{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.sem; <-own }()
		p.exec.Handle(p.hard, msg)
	}()
}

// InFlight is the number of tasks being handled.
func (p *Pool) InFlight() int { return len(p.sem) }

// Stop stops pulling, releases buffered tasks, and waits for running tasks
// to finish and be acknowledged. When ctx ends first, running steps get
// their context cancelled and their tasks are released (not committed), and
// Stop waits for that before returning ctx's error. A second call returns
// at once.
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
		p.hardCancel()
		<-done
		return ctx.Err()
	}
}
