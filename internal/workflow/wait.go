package workflow

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// WaitSpec is a step that runs no function: a sleep, or a wait for an
// event (Context.StartWait).
//
// # How a wait holds nothing
//
// A wait is a step like any other: its task is published when the body
// reaches it, and the task that executes it stores what will end it —
// for a sleep or a wait's timeout, the step's own task as a timer
// (JetStream message schedule) that the server publishes when it is due,
// with the deadline in Task.WakeAt; for a hook, the token's record — and
// is acknowledged. Nothing is left in a worker's memory. The wait ends
// with the first commit of its step record (create-if-absent): the due
// timer's task commits the sleep's end or the timeout, an event sender
// commits the event (Sender). Whoever commits second finds the first
// record, so a wait ends once, the same way on every replay.
type WaitSpec struct {
	// Kind is state.StepSleep, state.StepEvent or state.StepHook.
	Kind string
	// Until is a sleep's deadline; For, when Until is zero, its length,
	// counted from when the wait's task first executes.
	Until time.Time
	For   time.Duration
	// Event names the event an event or hook wait waits for; Timeout (0:
	// none) ends the wait without one. Token is a hook's token.
	Event   string
	Timeout time.Duration
	Token   string
}

// Error kinds of a wait's record that holds no event.
const (
	// KindTimeout: the wait's timeout passed before an event came.
	KindTimeout = "timeout"
	// KindHookTaken: the hook token was already taken by another wait.
	KindHookTaken = "hook-taken"
	// The codes of those failures (StepError.Code).
	CodeEventTimeout = "event_timeout"
	CodeHookTaken    = "hook_taken"
)

// validate checks s and returns the name of its step.
func (s WaitSpec) validate(name string) (string, error) {
	switch s.Kind {
	case state.StepSleep:
		if s.For < 0 {
			return "", fmt.Errorf("%w: negative sleep %s", ErrInput, s.For)
		}
		if _, err := s.Until.MarshalJSON(); err != nil {
			return "", fmt.Errorf("%w: sleep until %s: %w", ErrInput, s.Until, err)
		}
		return name, state.ValidateName(name)
	case state.StepEvent, state.StepHook:
		if err := state.ValidateName(s.Event); err != nil {
			return "", err
		}
		if s.Timeout < 0 {
			return "", fmt.Errorf("%w: negative timeout %s", ErrInput, s.Timeout)
		}
		if s.Kind == state.StepEvent {
			return state.EventStepName(s.Event), nil
		}
		return state.HookStepName(s.Event), state.ValidateHookToken(s.Token)
	}
	return "", fmt.Errorf("%w: unknown wait kind %q", ErrInput, s.Kind)
}

// StartWait starts the next wait of the body: a sleep (its step is called
// name), or a wait for the event spec.Event (its step is called
// state.EventStepName or state.HookStepName of the event, so that no step
// the body names can be committed by a sender). Like Start, it returns the
// handle at once; Await or Result waits. Invalid arguments are returned as
// errors.
func (c *Context) StartWait(name string, spec WaitSpec) (*Pending, error) {
	if c.parked {
		c.park(nil)
	}
	name, err := spec.validate(name)
	if err != nil {
		return nil, err
	}
	p := c.next(name)
	p.call = &stepCall{name: name, id: p.id, seq: p.seq, wait: &spec}
	c.begin(p)
	return p, nil
}

// startWait is the execution of a wait step: when this task is the wait's
// due timer it commits the wait's end (a sleep's, or a wait's timeout);
// otherwise it stores what ends the wait (the hook's token, a timer) and
// returns a nil record: the wait goes on without holding anything. A
// record another writer committed first is returned instead of this one's.
func (e *Executor) startWait(d *delivery, sc *stepCall) (*state.Step, *settlement) {
	// A task of a run that has ended or been replaced (a recheck or a
	// wake that outlived it) must neither store timers nor take tokens.
	if s := e.stillRunning(d, true); s != nil {
		return nil, s
	}
	w, now := sc.wait, e.cfg.TimerNow()
	if due := d.task.WakeAt; d.task.StepID == sc.id && !due.IsZero() {
		if now.Before(due) {
			// The server's clock is ahead of this worker's: the wait is
			// not over by this clock. Hold the task until it is.
			return nil, &settlement{kind: settleRelease, delay: due.Sub(now),
				err: fmt.Errorf("wait %s due at %s came early by this worker's clock", sc.id, due.Format(time.RFC3339Nano))}
		}
		return e.commitRecord(d, sc, expired(d, sc, due))
	}
	if w.Kind == state.StepHook {
		taken, err := e.registerHook(d, sc)
		if err != nil {
			return nil, &settlement{kind: settleRelease, err: err}
		}
		if taken != nil {
			return e.commitRecord(d, sc, taken)
		}
	}
	deadline := w.deadline(now)
	if !deadline.IsZero() && !deadline.After(now) {
		return e.commitRecord(d, sc, expired(d, sc, deadline))
	}
	if err := e.scheduleWake(d, sc, deadline, now); err != nil {
		return nil, &settlement{kind: settleRelease, err: err}
	}
	return nil, nil
}

// WaitRecheck is how often a wait without a deadline (an event wait
// without a timeout) has its task delivered again: the timer that does it
// is what tells the sweeper the run is waiting, not stuck, and a replay
// at each recheck resumes a run whose resume task was lost.
const WaitRecheck = 24 * time.Hour

// deadline is when the wait ends without an event, for a wait that starts
// at now; zero for none.
func (s WaitSpec) deadline(now time.Time) time.Time {
	switch {
	case s.Kind == state.StepSleep && !s.Until.IsZero():
		return s.Until
	case s.Kind == state.StepSleep:
		return now.Add(s.For)
	case s.Timeout > 0:
		return now.Add(s.Timeout)
	}
	return time.Time{}
}

// expired is the record of wait sc whose deadline passed: a sleep's end,
// whose output is the deadline, or a wait's timeout, a fatal failure of
// kind KindTimeout.
func expired(d *delivery, sc *stepCall, deadline time.Time) *state.Step {
	rec := &state.Step{
		V: state.Version, StepID: sc.id, RunID: d.run.RunID, Name: sc.name, Seq: sc.seq, Attempt: 1,
		Kind: sc.wait.Kind, WakeAt: deadline.UTC(), HookToken: sc.wait.Token,
	}
	if sc.wait.Kind == state.StepSleep {
		// Until was validated; a deadline counted from now with For is
		// within 292 years of it.
		rec.Output, _ = deadline.UTC().MarshalJSON()
		return rec
	}
	rec.Error = &state.ErrorInfo{Kind: KindTimeout, Fatal: true, Code: CodeEventTimeout,
		Message: fmt.Sprintf("no event %s within %s", sc.wait.Event, sc.wait.Timeout)}
	return rec
}

// scheduleWake stores the task of wait sc as a timer due at deadline, or,
// for a wait without one, as a recheck due WaitRecheck after now. A task
// that may not be the first to execute the wait (a redelivery, a
// redispatch, a resume) first looks for the timer an earlier one stored,
// and keeps it: its deadline was counted from the wait's first start.
func (e *Executor) scheduleWake(d *delivery, sc *stepCall, deadline, now time.Time) error {
	subject := jetstream.TaskSubject(d.run.Workflow, d.run.RunID, sc.id)
	if d.delivered > 1 || d.task.Redispatched || d.task.Resume || d.task.StepID != sc.id {
		// A recheck's own due message may still be in the timers stream
		// (its forward's ack in flight): only a stored timer counts then.
		waiting, err := jetstream.HasTimer(d.nctx, e.cfg.Assets.Timers, subject, d.task.Recheck && d.task.StepID == sc.id)
		if err != nil || waiting {
			return err
		}
	}
	t := state.StepTask(d.run, d.rev, sc.id)
	at := deadline
	if deadline.IsZero() {
		at, t.Redispatched, t.Recheck = now.Add(WaitRecheck), true, true
	} else {
		t.WakeAt = deadline.UTC()
	}
	b, err := state.Encode(t)
	if err != nil {
		return err
	}
	err = e.scheduleTimer(d.nctx, subject, timerMsgID(t), b, at)
	if errors.Is(err, jetstream.ErrTimerExists) {
		return nil // stored by an earlier delivery within the broker's window
	}
	return err
}

// timerMsgID names the task message of a timer, which the timer and the
// task it becomes share, so that a repeated store or forward within the
// broker's window is absorbed: one per retry of a step, one per wait's
// deadline, one per wait's recheck.
func timerMsgID(t state.Task) string {
	switch {
	case !t.WakeAt.IsZero():
		return t.StepID + "#wake"
	case t.Recheck:
		return t.StepID + "#recheck"
	}
	return retryMsgID(t)
}

// registerHook records that the token of hook wait sc resumes sc. It
// returns nil when the token is sc's (now or already), or the record to
// commit when another wait has taken it: a fatal failure of kind
// KindHookTaken. A token held by an earlier run under the same run ID
// (a generation the conflict policy's StartNew replaced, or a run that
// expired) is taken over: that run has ended, and this run derives the
// same token from the same run ID.
func (e *Executor) registerHook(d *delivery, sc *stepCall) (*state.Step, error) {
	h := state.Hook{
		V: state.Version, Token: sc.wait.Token, RunID: d.run.RunID, Workflow: d.run.Workflow, RunToken: d.run.Token,
		Generation: d.run.Generation, StepID: sc.id, Event: sc.wait.Event, CreatedAt: e.cfg.Now().UTC(),
	}
	owner, err := HookTokens{Assets: e.cfg.Assets}.Register(d.nctx, h)
	if err != nil {
		return nil, err
	}
	if owner.StepID == sc.id && owner.RunToken == d.run.Token {
		return nil, nil
	}
	return &state.Step{
		V: state.Version, StepID: sc.id, RunID: d.run.RunID, Name: sc.name, Seq: sc.seq, Attempt: 1,
		Kind: state.StepHook, HookToken: sc.wait.Token,
		Error: &state.ErrorInfo{Kind: KindHookTaken, Fatal: true, Code: CodeHookTaken,
			Message: fmt.Sprintf("hook token %s is taken by run %s (step %s)", sc.wait.Token, owner.RunID, owner.StepID)},
	}, nil
}
