package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Timers: a task that must not run before a time (a retry after its
// backoff) is stored in JETFLOW_TIMERS as a message schedule on
// jetflow.timer.<rest>, where jetflow.task.<rest> is its task subject. When
// it is due the server publishes it to jetflow.due.<rest>; a worker moves it
// from there into the task stream (ForwardDue). Nothing waits in a worker's
// memory or holds a consumer's ack-pending slot meanwhile.
const (
	TimersStream = "JETFLOW_TIMERS"
	// DueConsumer is the durable consumer of due timers, shared by every
	// worker.
	DueConsumer   = "jetflow_due"
	taskPrefix    = "jetflow.task."
	timerPrefix   = "jetflow.timer."
	duePrefix     = "jetflow.due."
	timerSubjects = timerPrefix + ">"
	dueSubjects   = duePrefix + ">"
)

// ScheduleTask stores data as a timer that becomes a task on taskSubject at
// at, rounded up to the next whole second (schedules count whole seconds;
// a timer never fires early). A later timer for the same task subject
// replaces an earlier one that has not fired. msgID deduplicates a repeated
// call within the broker's window.
func ScheduleTask(ctx context.Context, js natsjs.JetStream, taskSubject, msgID string, data []byte, at time.Time) error {
	if !strings.HasPrefix(taskSubject, taskPrefix) {
		return fmt.Errorf("jetflow: schedule: %q is not a task subject", taskSubject)
	}
	if t := at.Truncate(time.Second); t.Before(at) {
		at = t.Add(time.Second)
	}
	rest := strings.TrimPrefix(taskSubject, taskPrefix)
	msg := &nats.Msg{Subject: timerPrefix + rest, Data: data, Header: nats.Header{}}
	ack, err := js.PublishMsg(ctx, msg, natsjs.WithMsgID(msgID), natsjs.WithExpectStream(TimersStream),
		natsjs.WithScheduleAt(at.UTC()), natsjs.WithScheduleTarget(duePrefix+rest))
	if err != nil {
		return fmt.Errorf("jetflow: schedule task %s: %w", taskSubject, err)
	}
	if ack.Duplicate {
		// The same timer (by message ID) was stored before and may have
		// fired and gone: this one would be dropped silently.
		return fmt.Errorf("jetflow: schedule task %s: %w", taskSubject, ErrTimerExists)
	}
	return nil
}

// ErrTimerExists: a timer with the same message ID was stored within the
// broker's duplicate window.
var ErrTimerExists = errors.New("jetflow: timer already stored")

// HasTimer reports whether the task on taskSubject has a timer waiting in
// timers, stored or fired but not yet moved into the task stream; with
// storedOnly, only one stored and not yet fired. It costs one stream-info
// request with a subject filter.
func HasTimer(ctx context.Context, timers natsjs.Stream, taskSubject string, storedOnly bool) (bool, error) {
	rest, ok := strings.CutPrefix(taskSubject, taskPrefix)
	if !ok {
		return false, fmt.Errorf("jetflow: %q is not a task subject", taskSubject)
	}
	filter := "jetflow.*." + rest
	if storedOnly {
		filter = timerPrefix + rest
	}
	info, err := timers.Info(ctx, natsjs.WithSubjectFilter(filter))
	if err != nil {
		return false, fmt.Errorf("jetflow: timers of %s: %w", taskSubject, err)
	}
	for _, n := range info.State.Subjects {
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// DueTaskSubject is the task subject a due timer on subject stands for.
func DueTaskSubject(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, duePrefix)
	return taskPrefix + rest, ok && rest != ""
}

// EnsureDueConsumer creates the consumer of due timers, or binds to it.
func (a *Assets) EnsureDueConsumer(ctx context.Context, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, TimersStream, DueConsumer, dueSubjects, "jetflow due timers, moved into "+TasksStream, cc)
}
