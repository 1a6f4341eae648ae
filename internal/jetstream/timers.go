package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Timers: a task that must not run before a time (a retry after its
// backoff, a sleep's end, a wait's timeout or recheck) is stored in
// JETFLOW_TIMERS as a message schedule on jetflow.sched.<timer>, where
// <timer> is <kind>.<workflow>.<step-id> (Timer): one subject per step, so
// a run can have several timers at once (a sleep and a wait's timeout
// awaited together), and a later timer of the same step replaces an
// earlier one that has not fired. When it is due the server publishes it
// to jetflow.fire.<timer>; a worker moves it from there into the task
// stream, to the task subject the timer names (DueForwarder in
// internal/workflow). Nothing waits in a worker's memory or holds a
// consumer's ack-pending slot meanwhile.
const (
	TimersStream = "JETFLOW_TIMERS"
	// DueConsumer is the durable consumer of due timers, shared by every
	// worker.
	DueConsumer   = "jetflow_fire"
	timerPrefix   = "jetflow.sched."
	firePrefix    = "jetflow.fire."
	timerSubjects = timerPrefix + ">"
	fireSubjects  = firePrefix + ">"
	// TimerSubjects are the subjects timers are stored on.
	TimerSubjects = timerSubjects
	// The timer subjects of versions before the lease executor: kept in
	// the stream for their workers, never used by this one.
	legacyTimerSubjects = "jetflow.timer.>"
	legacyDueSubjects   = "jetflow.due.>"
)

// Timer kinds: which task a timer becomes.
const (
	timerRun    = "run"
	timerBranch = "branch"
)

// A Timer names the timer of one step: where it is stored and the task
// subject it becomes when due.
type Timer struct {
	kind, workflow, stepID string
}

// RunTimer is the timer of step stepID of a run whose due task is a wake
// of the run (its run subject): a sleep, a wait's timeout or recheck, the
// retry of a step the run's holder runs.
func RunTimer(workflow, stepID string) Timer { return Timer{timerRun, workflow, stepID} }

// BranchTimer is the timer of the branch stepID's retry: its due task is
// the branch's task.
func BranchTimer(workflow, stepID string) Timer { return Timer{timerBranch, workflow, stepID} }

func (t Timer) rest() string { return t.kind + "." + t.workflow + "." + t.stepID }

// TaskSubject is the subject of the task the timer becomes.
func (t Timer) TaskSubject() string {
	if t.kind == timerBranch {
		return BranchSubject(t.workflow, t.stepID)
	}
	identity, _, _ := strings.Cut(t.stepID, ".")
	return RunSubject(t.workflow, identity)
}

// String is the timer's stored subject.
func (t Timer) String() string { return timerPrefix + t.rest() }

// parseTimer reads the timer of rest (<kind>.<workflow>.<step-id>).
func parseTimer(rest string) (Timer, bool) {
	kind, rest, ok1 := strings.Cut(rest, ".")
	workflow, step, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || (kind != timerRun && kind != timerBranch) || strings.Count(step, ".") != 2 {
		return Timer{}, false
	}
	return Timer{kind, workflow, step}, true
}

// DueHeader records on a stored timer when it is due by the clock of the
// worker that stored it (RFC 3339, nanoseconds). It is the time the server
// publishes the timer, except under a test kit's clock that runs ahead of
// real time (FireDue).
const DueHeader = "Jetflow-Due"

// TaskIDHeader carries, on a stored timer, the message ID of the task it
// becomes: the timer keeps its headers when it fires, but for its own
// message ID, and the task it becomes is published with this one.
const TaskIDHeader = "Jetflow-Task-Id"

// ScheduleTimer stores data as timer t, due at due by the scheduling
// worker's clock (recorded in DueHeader), which the server publishes at at
// (real time, rounded up to the next whole second: schedules count whole
// seconds, and a timer never fires early). A later timer of the same step
// replaces an earlier one that has not fired. msgID deduplicates a repeated
// call within the broker's window (a repeat gets ErrTimerExists), and is
// the message ID of the task the timer becomes (TaskIDHeader).
func ScheduleTimer(ctx context.Context, js natsjs.JetStream, t Timer, msgID string, data []byte, due, at time.Time) error {
	if t.workflow == "" || t.stepID == "" {
		return fmt.Errorf("jetflow: schedule: timer without workflow or step")
	}
	if r := at.Truncate(time.Second); r.Before(at) {
		at = r.Add(time.Second)
	}
	ack, err := storeTimer(ctx, js, t, msgID, data, due, at, natsjs.WithMsgID(msgID))
	if err != nil {
		return fmt.Errorf("jetflow: schedule %s: %w", t, err)
	}
	if ack.Duplicate {
		// The same timer (by message ID) was stored before and may have
		// fired and gone: this one would be dropped silently.
		return fmt.Errorf("jetflow: schedule %s: %w", t, ErrTimerExists)
	}
	return nil
}

// storeTimer publishes timer t.
func storeTimer(ctx context.Context, js natsjs.JetStream, t Timer, taskID string, data []byte, due, at time.Time, opts ...natsjs.PublishOpt) (*natsjs.PubAck, error) {
	msg := &nats.Msg{Subject: timerPrefix + t.rest(), Data: data, Header: nats.Header{}}
	msg.Header.Set(DueHeader, due.UTC().Format(time.RFC3339Nano))
	if taskID != "" {
		msg.Header.Set(TaskIDHeader, taskID)
	}
	opts = append(opts, natsjs.WithExpectStream(TimersStream), natsjs.WithScheduleAt(at.UTC()),
		natsjs.WithScheduleTarget(firePrefix+t.rest()))
	return js.PublishMsg(ctx, msg, opts...)
}

// Expiry timers: a batch of ended runs whose records are due to be
// removed (state.Expiry) is stored on jetflow.sched.expire.<due>.<id>
// (<due> in Unix seconds, <id> the batch's own) and fired to
// jetflow.sched.expired.<due>.<id>, where the consumer of due expiries
// (ExpiryConsumer) takes it. Both subjects are under jetflow.sched.>, which
// every version's provisioning keeps in the stream, and outside
// jetflow.fire.>, so that a worker of the version before, which shares the
// consumer of due timers and knows no expiry, never takes one. They have
// five tokens, so no run's timer filter (RunTimersFilters, HasTimer: six
// or more) matches them.
const (
	expirePrefix  = timerPrefix + "expire."
	expiredPrefix = timerPrefix + "expired."
	// ExpiryConsumer is the durable consumer of due expiries, shared by
	// every worker.
	ExpiryConsumer = "jetflow_expire"
)

// ScheduleExpiry stores data, an expiry batch, as a timer of its own
// (id, a unique token) due at due, rounded up to the next whole second:
// a due time in the past fires at once. A repeat call with the same id
// within the broker's duplicate window stores nothing more.
func ScheduleExpiry(ctx context.Context, js natsjs.JetStream, id string, data []byte, due time.Time) error {
	at := due.Truncate(time.Second)
	if at.Before(due) {
		at = at.Add(time.Second)
	}
	rest := strconv.FormatInt(at.Unix(), 10) + "." + id
	msg := &nats.Msg{Subject: expirePrefix + rest, Data: data, Header: nats.Header{}}
	msg.Header.Set(DueHeader, due.UTC().Format(time.RFC3339Nano))
	_, err := js.PublishMsg(ctx, msg, natsjs.WithMsgID("expire."+id), natsjs.WithExpectStream(TimersStream),
		natsjs.WithScheduleAt(at.UTC()), natsjs.WithScheduleTarget(expiredPrefix+rest))
	if err != nil {
		return fmt.Errorf("jetflow: schedule expiry %s: %w", rest, err)
	}
	return nil
}

// IsExpiry reports whether subject is an expiry timer's, stored or fired:
// no task's.
func IsExpiry(subject string) bool {
	return strings.HasPrefix(subject, expirePrefix) || strings.HasPrefix(subject, expiredPrefix)
}

// EnsureExpiryConsumer creates the consumer of due expiries, or binds to
// it.
func (a *Assets) EnsureExpiryConsumer(ctx context.Context, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, TimersStream, ExpiryConsumer, expiredPrefix+">",
		"jetflow due expiries: the records of ended runs to remove", cc)
}

// ErrTimerExists: a timer with the same message ID was stored within the
// broker's duplicate window.
var ErrTimerExists = errors.New("jetflow: timer already stored")

// HasTimer reports whether timer t is waiting in timers, stored or fired
// but not yet moved into the task stream; with storedOnly, only one stored
// and not yet fired. It costs one stream-info request with a subject
// filter.
func HasTimer(ctx context.Context, timers natsjs.Stream, t Timer, storedOnly bool) (bool, error) {
	filter := "jetflow.*." + t.rest()
	if storedOnly {
		filter = timerPrefix + t.rest()
	}
	return hasMessages(ctx, timers, filter)
}

// RunTimersFilters are the subject filters of every timer of the run
// generation identity of workflow, stored or fired.
func RunTimersFilters(workflow, identity string) []string {
	return []string{
		timerPrefix + "*." + workflow + "." + identity + ".>",
		firePrefix + "*." + workflow + "." + identity + ".>",
	}
}

// hasMessages asks a stream whether it holds messages on the subjects
// matching filter: one stream-info request with a subject filter, which
// the server answers from its subject index without reading messages.
func hasMessages(ctx context.Context, st natsjs.Stream, filter string) (bool, error) {
	info, err := st.Info(ctx, natsjs.WithSubjectFilter(filter))
	if err != nil {
		return false, fmt.Errorf("jetflow: stream info %s: %w", filter, err)
	}
	for _, n := range info.State.Subjects {
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// HasMessages reports whether st holds a message on a subject matching
// one of filters (a stream-info request each, until one has).
func HasMessages(ctx context.Context, st natsjs.Stream, filters ...string) (bool, error) {
	for _, f := range filters {
		if has, err := hasMessages(ctx, st, f); has || err != nil {
			return has, err
		}
	}
	return false, nil
}

// DueTimer is the timer a due message on subject (jetflow.fire.<timer>)
// stands for.
func DueTimer(subject string) (Timer, bool) {
	rest, ok := strings.CutPrefix(subject, firePrefix)
	if !ok {
		return Timer{}, false
	}
	return parseTimer(rest)
}

// EnsureDueConsumer creates the consumer of due timers, or binds to it.
func (a *Assets) EnsureDueConsumer(ctx context.Context, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, TimersStream, DueConsumer, fireSubjects, "jetflow due timers, moved into "+TasksStream, cc)
}

// A StoredTimer is a timer stored and not yet fired.
type StoredTimer struct {
	Timer Timer
	// TaskSubject is the subject of the task the timer becomes.
	TaskSubject string
	// Due is when the timer is due by the clock of the worker that stored
	// it (DueHeader; for a timer stored without it, the schedule's time).
	Due time.Time
	// Data is the task.
	Data   []byte
	seq    uint64
	taskID string
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
		if n == 0 || IsExpiry(subject) {
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
	t, ok := parseTimer(strings.TrimPrefix(subject, timerPrefix))
	if !ok {
		return StoredTimer{}, false, nil // not a timer of this version's
	}
	return StoredTimer{Timer: t, TaskSubject: t.TaskSubject(), Due: due, Data: m.Data, seq: m.Sequence, taskID: m.Header.Get(TaskIDHeader)}, true, nil
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
	for {
		if st.Due.After(now) {
			return false, nil
		}
		_, err := storeTimer(ctx, js, st.Timer, st.taskID, st.Data, st.Due, time.Now(), natsjs.WithExpectLastSequencePerSubject(st.seq))
		if !IsWrongLastSequence(err) {
			if err != nil {
				return false, fmt.Errorf("jetflow: fire timer of %s: %w", st.TaskSubject, err)
			}
			return true, nil
		}
		// Fired or replaced meanwhile: judge what is stored now.
		var ok bool
		if st, ok, err = storedTimer(ctx, timers, st.Timer.String()); err != nil || !ok {
			return false, err
		}
	}
}

// CountMessages is how many messages st holds on subjects matching each of
// filters, summed: one stream-info request a filter, answered from the
// server's subject index.
func CountMessages(ctx context.Context, st natsjs.Stream, filters ...string) (uint64, error) {
	var n uint64
	for _, f := range filters {
		info, err := st.Info(ctx, natsjs.WithSubjectFilter(f))
		if err != nil {
			return 0, fmt.Errorf("jetflow: stream info %s: %w", f, err)
		}
		for _, k := range info.State.Subjects {
			n += k
		}
	}
	return n, nil
}

// LegacyTimerSubjects are the timer subjects of the executor before the
// lease (engine protocol 1), which this version neither publishes on nor
// consumes (its tasks: LegacyTaskSubjects).
var LegacyTimerSubjects = []string{legacyTimerSubjects, legacyDueSubjects}
