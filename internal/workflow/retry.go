package workflow

import (
	"context"
	"errors"
	"strconv"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// timerMinDelay is the shortest backoff kept in a timer. A shorter one waits
// as a delayed NAK: that keeps the task ack-pending on its consumer for the
// delay, which is harmless for a moment but, over a long backoff during a
// downstream outage, could fill the consumer's MaxAckPending and stall every
// task of the workflow.
const timerMinDelay = 2 * time.Second

// retry settles a task whose step failed and is to run again after s.delay.
// A long delay is stored as a timer carrying the next attempt number, after
// the failed attempt is recorded (so that a task redispatched meanwhile
// counts on from it), and only then is the task acknowledged (and the ack
// confirmed). If the worker dies in between, the task is redelivered and
// runs early, as after any crash; the timer's task then finds its attempt
// already started and is dropped.
func (e *Executor) retry(ctx context.Context, log zerolog.Logger, msg natsjs.Msg, t state.Task, s *settlement) {
	err := e.recordFailure(ctx, attemptKey(t), s)
	if s.delay < timerMinDelay {
		if err != nil {
			log.Warn().Err(err).Msg("cannot log the failed attempt; retrying all the same")
		}
		settleErr(log, msg.NakWithDelay(s.delay), "nak")
		return
	}
	t.Attempt, t.Redispatched = s.attempt+1, false
	b, eerr := state.Encode(t)
	err = errors.Join(err, eerr)
	if err == nil {
		err = e.scheduleTimer(ctx, msg.Subject(), retryMsgID(t), b, e.cfg.TimerNow().Add(s.delay))
	}
	if err != nil {
		log.Warn().Err(err).Msg("cannot store the retry timer; the task waits ack-pending instead")
		settleErr(log, msg.NakWithDelay(s.delay), "nak")
		return
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	settleErr(log, msg.DoubleAck(actx), "ack")
}

// ScheduleFunc stores a timer due at due by the executor's timer clock
// (Config.TimerNow): it calls store with the real time the server is to publish
// the timer at and returns store's error. A test kit whose clock runs ahead
// of real time maps due back to real time, and may hold a store while it
// moves its clock.
type ScheduleFunc func(due time.Time, store func(at time.Time) error) error

// scheduleTimer stores data as the timer of taskSubject, due at due by
// Config.TimerNow, through Config.Schedule.
func (e *Executor) scheduleTimer(ctx context.Context, taskSubject, msgID string, data []byte, due time.Time) error {
	store := func(at time.Time) error {
		return jetstream.ScheduleTimer(ctx, e.cfg.Assets.JS, taskSubject, msgID, data, due, at)
	}
	if e.cfg.Schedule == nil {
		return store(due)
	}
	return e.cfg.Schedule(due, store)
}

// retryMsgID names the task message of one retry of a step: the timer and
// the task it becomes share it, so a repeated store or forward within the
// broker's window is absorbed.
func retryMsgID(t state.Task) string {
	return attemptKey(t) + "#" + strconv.Itoa(t.Attempt)
}

// DueForwarder moves due timers from JETFLOW_TIMERS into the task stream
// (a consume.Handler). While its task subject still holds a task (the
// failed task whose acknowledgement is in flight, a redispatched task about
// to give way to the timer, or the failed task redelivered after a crash),
// the timer is tried again a second later; in the last case its task,
// once moved, finds its attempt already started and is dropped.
type DueForwarder struct {
	JS  natsjs.JetStream
	Log zerolog.Logger
}

// Handle publishes one due timer as a task and acknowledges it.
func (f *DueForwarder) Handle(ctx context.Context, msg natsjs.Msg) {
	subject, ok := jetstream.DueTaskSubject(msg.Subject())
	t, err := state.DecodeTask(msg.Data())
	if !ok || err != nil {
		f.Log.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed due timer terminated")
		f.settle(msg.TermWithReason("malformed due timer"))
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	d, err := jetstream.PublishTask(pctx, f.JS, subject, timerMsgID(t), msg.Data())
	log := RunLogger(f.Log, t.Workflow, t.RunID)
	if err != nil {
		log.Warn().Err(err).Str("subject", subject).Msg("cannot publish a due task; retrying")
		f.settle(msg.NakWithDelay(time.Second))
		return
	}
	if d == jetstream.PendingSubject {
		log.Debug().Str("subject", subject).Msg("due timer waits: a task for it is pending")
		f.settle(msg.NakWithDelay(time.Second))
		return
	}
	f.settle(msg.Ack())
}

// Release hands a due timer back.
func (f *DueForwarder) Release(msg natsjs.Msg) error { return msg.Nak() }

func (f *DueForwarder) settle(err error) {
	if err != nil {
		f.Log.Warn().Err(err).Msg("cannot settle due timer")
	}
}

// recordFailure logs the failed attempt s retries in the attempt log of
// key, which also raises the log's started count to it: a task
// redispatched meanwhile counts on from there.
func (e *Executor) recordFailure(ctx context.Context, key string, s *settlement) error {
	f := state.AttemptFailure{StepID: s.stepID, Attempt: s.attempt, StartedAt: s.started.UTC(), EndedAt: e.cfg.Now().UTC(), Worker: e.cfg.WorkerID}
	if s.err != nil {
		f.Error = s.err.Error()
	}
	return e.editAttemptLog(ctx, key, func(l *state.AttemptLog, _ bool) (bool, error) {
		l.Add(f)
		return true, nil
	})
}
