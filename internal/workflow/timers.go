package workflow

import (
	"context"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// ScheduleFunc stores a timer due at due by the executor's timer clock
// (Config.TimerNow): it calls store with the real time the server is to publish
// the timer at and returns store's error. A test kit whose clock runs ahead
// of real time maps due back to real time, and may hold a store while it
// moves its clock.
type ScheduleFunc func(due time.Time, store func(at time.Time) error) error

// storeTimer stores task as timer t of d's run, due at due by
// Config.TimerNow, through Config.Schedule, under msgID: the timer's and
// the task's it becomes. A timer already stored under msgID within the
// broker's window is not an error.
func (e *Executor) storeTimer(d *delivery, t jetstream.Timer, msgID string, task state.Task, due time.Time) error {
	b, err := state.Encode(task)
	if err != nil {
		return err
	}
	store := func(at time.Time) error {
		return jetstream.ScheduleTimer(d.nctx, e.cfg.Assets.JS, t, msgID, b, due, at)
	}
	if e.cfg.Schedule == nil {
		err = store(due)
	} else {
		err = e.cfg.Schedule(due, store)
	}
	if errors.Is(err, jetstream.ErrTimerExists) {
		return nil
	}
	return err
}

// DueForwarder moves due timers from JETFLOW_TIMERS into the task stream
// (a consume.Handler): a run's timer becomes a wake of the run, a branch's
// its retry. While the task subject still holds a task (the run's holder
// is at work, or the failed branch's acknowledgement is in flight) the
// timer is tried again a second later: a run has one run task at a time,
// and the holder at work sees what the timer is about, or parks and takes
// it next.
type DueForwarder struct {
	JS  natsjs.JetStream
	Log zerolog.Logger
}

// Handle publishes one due timer as a task and acknowledges it.
func (f *DueForwarder) Handle(ctx context.Context, d *consume.Delivery) {
	msg := d.Msg
	timer, ok := jetstream.DueTimer(msg.Subject())
	t, err := state.DecodeTask(msg.Data())
	if !ok || err != nil {
		f.Log.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed due timer terminated")
		f.settle(msg.TermWithReason("malformed due timer"))
		return
	}
	msgID := msg.Headers().Get(jetstream.TaskIDHeader)
	if msgID == "" {
		msgID = t.StepID + "#due"
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	subject := timer.TaskSubject()
	dedup, err := jetstream.PublishTask(pctx, f.JS, subject, msgID, msg.Data())
	log := RunLogger(f.Log, t.Workflow, t.RunID)
	if err != nil {
		log.Warn().Err(err).Str("subject", subject).Msg("cannot publish a due task; retrying")
		f.settle(msg.NakWithDelay(time.Second))
		return
	}
	if dedup == jetstream.PendingSubject {
		log.Debug().Str("subject", subject).Msg("due timer waits: a task for it is pending")
		f.settle(msg.NakWithDelay(time.Second))
		return
	}
	f.settle(msg.Ack())
}

// Release hands a due timer back.
func (f *DueForwarder) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

func (f *DueForwarder) settle(err error) { logSettle(f.Log, "due timer", err) }

// logSettle logs at warn a settlement (ack, nak, term) of a message of
// JETFLOW_TIMERS, a what, that failed: its redelivery settles it again.
func logSettle(log zerolog.Logger, what string, err error) {
	if err != nil {
		log.Warn().Err(err).Msg("cannot settle " + what)
	}
}
