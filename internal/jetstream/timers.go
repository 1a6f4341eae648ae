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
	// TimerSubjects are the subjects timers are stored on.
	TimerSubjects = timerSubjects
	dueSubjects   = duePrefix + ">"
)

// ScheduleTask stores data as a timer that becomes a task on taskSubject at
// at, rounded up to the next whole second (schedules count whole seconds;
// a timer never fires early). A later timer for the same task subject
// replaces an earlier one that has not fired. msgID deduplicates a repeated
// call within the broker's window. It is ScheduleTimer with the timer due
// at the time the server publishes it.
func ScheduleTask(ctx context.Context, js natsjs.JetStream, taskSubject, msgID string, data []byte, at time.Time) error {
	return ScheduleTimer(ctx, js, taskSubject, msgID, data, at, at)
}

// DueHeader records on a stored timer when it is due by the clock of the
// worker that stored it (RFC 3339, nanoseconds). It is the time the server
// publishes the timer, except under a test kit's clock that runs ahead of
// real time (FireDue).
const DueHeader = "Jetflow-Due"

// ScheduleTimer is ScheduleTask for a timer due at due by the scheduling
// worker's clock (recorded in DueHeader) that the server publishes at at
// (real time, rounded up to the next whole second).
func ScheduleTimer(ctx context.Context, js natsjs.JetStream, taskSubject, msgID string, data []byte, due, at time.Time) error {
	if !strings.HasPrefix(taskSubject, taskPrefix) {
		return fmt.Errorf("jetflow: schedule: %q is not a task subject", taskSubject)
	}
	if t := at.Truncate(time.Second); t.Before(at) {
		at = t.Add(time.Second)
	}
	rest := strings.TrimPrefix(taskSubject, taskPrefix)
	ack, err := storeTimer(ctx, js, rest, data, due, at, natsjs.WithMsgID(msgID))
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

// storeTimer publishes the timer of the task subject jetflow.task.<rest>.
func storeTimer(ctx context.Context, js natsjs.JetStream, rest string, data []byte, due, at time.Time, opts ...natsjs.PublishOpt) (*natsjs.PubAck, error) {
	msg := &nats.Msg{Subject: timerPrefix + rest, Data: data, Header: nats.Header{}}
	msg.Header.Set(DueHeader, due.UTC().Format(time.RFC3339Nano))
	opts = append(opts, natsjs.WithExpectStream(TimersStream), natsjs.WithScheduleAt(at.UTC()),
		natsjs.WithScheduleTarget(duePrefix+rest))
	return js.PublishMsg(ctx, msg, opts...)
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

// A StoredTimer is a timer stored and not yet fired.
type StoredTimer struct {
	// TaskSubject is the subject of the task the timer becomes.
	TaskSubject string
	// Due is when the timer is due by the clock of the worker that stored
	// it (DueHeader; for a timer stored without it, the schedule's time).
	Due time.Time
	// Data is the task.
	Data []byte
	seq  uint64
}

// StoredTimers lists the timers stored in timers and not yet fired: the
// latest timer of each task subject (the one the server will publish).
func StoredTimers(ctx context.Context, timers natsjs.Stream) ([]StoredTimer, error) {
	info, err := timers.Info(ctx, natsjs.WithSubjectFilter(timerSubjects))
	if err != nil {
		return nil, fmt.Errorf("jetflow: list timers: %w", err)
	}
	var out []StoredTimer
	for subject, n := range info.State.Subjects {
		if n == 0 {
			continue
		}
		st, ok, err := storedTimer(ctx, timers, subject)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, st)
		}
	}
	return out, nil
}

// storedTimer reads the latest timer on subject (jetflow.timer.<rest>);
// false when it fired and was removed meanwhile.
func storedTimer(ctx context.Context, timers natsjs.Stream, subject string) (StoredTimer, bool, error) {
	m, err := timers.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return StoredTimer{}, false, nil
	}
	if err != nil {
		return StoredTimer{}, false, fmt.Errorf("jetflow: read timer %s: %w", subject, err)
	}
	due, err := timerDue(m.Header)
	if err != nil {
		return StoredTimer{}, false, fmt.Errorf("jetflow: timer %s: %w", subject, err)
	}
	return StoredTimer{TaskSubject: taskPrefix + strings.TrimPrefix(subject, timerPrefix), Due: due, Data: m.Data, seq: m.Sequence}, true, nil
}

// timerDue is when a stored timer is due: its DueHeader, or for a timer
// stored without one, its schedule's time.
func timerDue(h nats.Header) (time.Time, error) {
	if v := h.Get(DueHeader); v != "" {
		return time.Parse(time.RFC3339Nano, v)
	}
	v, ok := strings.CutPrefix(h.Get("Nats-Schedule"), "@at ")
	if !ok {
		return time.Time{}, fmt.Errorf("no %s and no @at schedule", DueHeader)
	}
	return time.Parse(time.RFC3339, v)
}

// FireDue makes every stored timer due by now (by its DueHeader, the
// storing worker's clock) fire at once: it stores it again, scheduled for
// the current real time, in place of the waiting one (so the subject still
// fires once). A timer not due by now is left to its schedule. It returns
// how many timers it stored again. A timer that fires or is replaced while
// FireDue runs is left to that: the store expects the subject's last
// sequence, and a replacement is read and judged again.
//
// A repeat call stores again the timers that are due and have not fired
// yet (the server publishes a due schedule within a fraction of a second).
func FireDue(ctx context.Context, js natsjs.JetStream, timers natsjs.Stream, now time.Time) (int, error) {
	stored, err := StoredTimers(ctx, timers)
	if err != nil {
		return 0, err
	}
	fired := 0
	for _, st := range stored {
		ok, err := fireIfDue(ctx, js, timers, st, now)
		if err != nil {
			return fired, err
		}
		if ok {
			fired++
		}
	}
	return fired, nil
}

// fireIfDue stores timer st again for the current real time if it is due
// by now, and reports whether it did.
func fireIfDue(ctx context.Context, js natsjs.JetStream, timers natsjs.Stream, st StoredTimer, now time.Time) (bool, error) {
	rest := strings.TrimPrefix(st.TaskSubject, taskPrefix)
	for {
		if st.Due.After(now) {
			return false, nil
		}
		_, err := storeTimer(ctx, js, rest, st.Data, st.Due, time.Now(), natsjs.WithExpectLastSequencePerSubject(st.seq))
		if !IsWrongLastSequence(err) {
			if err != nil {
				return false, fmt.Errorf("jetflow: fire timer of %s: %w", st.TaskSubject, err)
			}
			return true, nil
		}
		// Fired or replaced meanwhile: judge what is stored now.
		var ok bool
		if st, ok, err = storedTimer(ctx, timers, timerPrefix+rest); err != nil || !ok {
			return false, err
		}
	}
}
