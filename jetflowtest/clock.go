package jetflowtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Clock is the time the Env's workers count sleeps, event timeouts and
// retry delays by: the real time plus how far the test advanced it
// (Env.Advance). It only moves forward.
//
// The workers store their timers as they do in production, as message
// schedules the server publishes when due; the clock maps a timer's due
// time back to the real time it is due at (due minus the offset), and
// Advance makes the server publish at once the timers that the move made
// due. Only timers count by the Env's time: step and run records, attempt
// logs, the sweeper and its StuckAfter check, retention and the run index
// keep real time, so a move makes none of them misfire.
type Clock struct {
	offset atomic.Int64 // nanoseconds
	// moving is held shared by a worker storing a timer and alone by a
	// move, so that a timer is either stored before a move (which then
	// sees it) or mapped with the moved offset.
	moving sync.RWMutex
}

func newClock() *Clock { return &Clock{} }

// Now is the Env's time: the real time plus the offset Advance added.
func (c *Clock) Now() time.Time { return time.Now().Add(c.Offset()) }

// Offset is how far the Env's time is ahead of real time.
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// ErrBackwards is the error of a move that would turn the Env's time back.
var ErrBackwards = errors.New("jetflowtest: the Env's time cannot go backwards")

// schedule stores a worker's timer due at due by the Env's time, at the
// real time it is due: due minus the offset (a workflow.ScheduleFunc).
func (c *Clock) schedule(due time.Time, store func(at time.Time) error) error {
	c.moving.RLock()
	defer c.moving.RUnlock()
	return store(due.Add(-c.Offset()))
}

// move adds d to the offset, or, with a non-zero to, moves the time to to,
// and then calls fire with the new time while no timer is being stored.
// A move backwards is ErrBackwards and changes nothing.
func (c *Clock) move(d time.Duration, to time.Time, fire func(now time.Time) (int, error)) (int, error) {
	c.moving.Lock()
	defer c.moving.Unlock()
	if !to.IsZero() {
		d = to.Sub(c.Now())
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: move by %s", ErrBackwards, d)
	}
	c.offset.Add(int64(d))
	return fire(c.Now())
}

// Advance moves the Env's time forward by d: every durable timer of the
// Env's runs that is due by the new time fires now — sleeps (jetflow.Sleep,
// SleepUntil, Timer), event and hook wait timeouts, the daily recheck of a
// wait without one, and retry delays stored as timers (RetryAfter, long
// backoffs). Timers not yet due stay stored and fire when a later Advance,
// or real time, reaches them. A timeout or sleep counts from when its wait
// started, by the Env's time: advance after the wait started (WaitTimer).
//
// Advance returns, with how many timers it made fire, once those were
// stored again for the server to publish at once; it does not wait for
// the runs to go on (Wait, Run's handle or Inspect do). A repeat call,
// even Advance(0), fires again the timers that are due and have not fired
// yet, which is harmless: a timer's task runs once. Advancing while steps
// run is safe: a timer a worker stores meanwhile is counted from the moved
// time or seen by the move. A negative d, or a move that cannot be made,
// fails the test at once.
func (e *Env) Advance(d time.Duration) int {
	e.t.Helper()
	return e.move(d, time.Time{})
}

// AdvanceTo moves the Env's time forward to t, as Advance does. A t before
// the Env's time fails the test.
func (e *Env) AdvanceTo(t time.Time) int {
	e.t.Helper()
	if t.IsZero() {
		e.t.Fatalf("jetflowtest: advance to the zero time")
	}
	return e.move(0, t)
}

func (e *Env) move(d time.Duration, to time.Time) int {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	js, timers, err := e.timers(ctx)
	if err == nil {
		var n int
		n, err = e.clock.move(d, to, func(now time.Time) (int, error) {
			return jetstream.FireDue(ctx, js, timers, now)
		})
		if err == nil {
			return n
		}
	}
	e.t.Fatalf("jetflowtest: advance the time: %v", err)
	return 0
}

// Clock is the Env's clock.
func (e *Env) Clock() *Clock { return e.clock }

// A Timer is a durable timer of a run, stored and not yet fired.
type Timer struct {
	RunID string
	// StepID is the step the timer is for: the sleep or wait it ends,
	// the step it retries.
	StepID string
	// Due is when it fires, by the Env's time.
	Due time.Time
	// Attempt is the attempt a retry's timer starts (0 for a sleep's or
	// a wait's timer).
	Attempt int
}

// Timers are the timers of the Env's runs stored and not yet fired. A read
// that could not be made fails the test.
func (e *Env) Timers() []Timer {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	out, err := e.readTimers(ctx)
	if err != nil {
		e.t.Fatalf("jetflowtest: read the timers: %v", err)
	}
	return out
}

func (e *Env) readTimers(ctx context.Context) ([]Timer, error) {
	_, timers, err := e.timers(ctx)
	if err != nil {
		return nil, err
	}
	stored, err := jetstream.StoredTimers(ctx, timers)
	if err != nil {
		return nil, err
	}
	out := make([]Timer, 0, len(stored))
	for _, st := range stored {
		tm, err := toTimer(st.Data, st.Due)
		if err != nil {
			return nil, fmt.Errorf("timer of %s: %w", st.TaskSubject, err)
		}
		out = append(out, tm)
	}
	return out, nil
}

// WaitTimer waits, within the Env's Timeout, until run runID has a timer
// stored, and returns it: the run is then waiting on a sleep, an event
// wait or a retry delay, counted from the Env's time it started at.
// Advance after it to make that timer due. A wait that could not be made
// or ended without a timer fails the test.
func (e *Env) WaitTimer(runID string) Timer {
	e.t.Helper()
	ctx, cancel := e.context()
	defer cancel()
	tm, err := e.waitTimer(ctx, runID)
	if err != nil {
		e.t.Fatalf("jetflowtest: wait for a timer of run %s: %v", runID, err)
	}
	return tm
}

// waitTimer watches the timers being stored, after looking at those
// stored before it started to watch.
func (e *Env) waitTimer(ctx context.Context, runID string) (Timer, error) {
	sub, err := e.nc.SubscribeSync(jetstream.TimerSubjects)
	if err != nil {
		return Timer{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := e.nc.FlushWithContext(ctx); err != nil {
		return Timer{}, err
	}
	stored, err := e.readTimers(ctx)
	if err != nil {
		return Timer{}, err
	}
	for _, tm := range stored {
		if tm.RunID == runID {
			return tm, nil
		}
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return Timer{}, err
		}
		if jetstream.IsExpiry(m.Subject) {
			continue // the records of ended runs, due after their retention
		}
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.DueHeader))
		if err != nil {
			return Timer{}, fmt.Errorf("timer on %s: %w", m.Subject, err)
		}
		if tm, err := toTimer(m.Data, due); err != nil || tm.RunID == runID {
			return tm, err
		}
	}
}

// toTimer is the Timer of a stored timer's task.
func toTimer(data []byte, due time.Time) (Timer, error) {
	t, err := state.DecodeTask(data)
	if err != nil {
		return Timer{}, err
	}
	tm := Timer{RunID: t.RunID, StepID: t.StepID, Due: due}
	if t.WakeAt.IsZero() && !t.Recheck {
		tm.Attempt = t.Attempt
	}
	return tm, nil
}

// timers are the JetStream context of the Env's client and its timers
// stream.
func (e *Env) timers(ctx context.Context) (natsjs.JetStream, natsjs.Stream, error) {
	js, err := natsjs.New(e.nc)
	if err != nil {
		return nil, nil, err
	}
	s, err := js.Stream(ctx, jetstream.TimersStream)
	if err != nil {
		return nil, nil, fmt.Errorf("timers stream: %w", err)
	}
	return js, s, nil
}
