package workflow

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// WaitSpec is a step that runs no function: a sleep, or a wait for an
// event (Context.StartWait).
//
// # How a wait holds nothing
//
// A wait is a step like any other: the holder that reaches it stores what
// will end it — for a sleep or a wait's timeout a timer (a JetStream
// message schedule) that the server publishes when it is due, as a wake
// of the run with the deadline in Task.WakeAt; for a hook, the token's
// record; for a wait with no deadline a recheck timer — and parks the run.
// Nothing is left in a worker's memory. The wait ends with the first
// commit of its step record (create-if-absent): the holder woken by the
// due timer commits the sleep's end or the timeout, an event sender
// commits the event (Sender). Whoever commits second finds the first
// record, so a wait ends once, the same way on every replay.
type WaitSpec struct {
	// Kind is state.StepSleep, state.StepEvent or state.StepHook.
	Kind string
	// Until is a sleep's deadline; For, when Until is zero, its length,
	// counted from when a holder first begins the wait.
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
	// The codes of those failures (StepError.Code; jetflowtype's).
	CodeEventTimeout = jetflowtype.CodeEventTimeout
	CodeHookTaken    = jetflowtype.CodeHookTaken
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

// WaitRecheck is how often a wait without a deadline (an event wait
// without a timeout, a parent waiting for its child) has its run woken
// again: the timer that does it is what tells the sweeper the run is
// waiting, not stuck, and the wake resumes a run whose wake was lost.
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

// timerOf reports whether the holder's task is a timer of p: its deadline
// (WakeAt) or its recheck.
func (h *holder) timerOf(p *Pending) bool {
	t := h.d.task
	return t.Wake && t.StepID == p.id && (!t.WakeAt.IsZero() || t.Recheck)
}

// beginWait begins the wait p, or ends it when this task is its due
// timer: the holder commits the sleep's end or the wait's timeout (or the
// hook's refusal when another wait took its token). Otherwise it stores
// what ends the wait — the hook's token, a timer — and leaves p
// uncommitted: the run parks unless the await is satisfied otherwise. An
// event or hook wait is looked up first: an event sent before the run
// reached its wait is kept there.
func (h *holder) beginWait(c *Context, p *Pending) *settlement {
	d, w, now := h.d, p.call.wait, h.e.cfg.TimerNow()
	if due := d.task.WakeAt; h.timerOf(p) && !due.IsZero() {
		if now.Before(due) {
			// The server's clock is ahead of this worker's: the wait is
			// not over by this clock. Hold the task until it is.
			return &settlement{kind: settleRelease, delay: due.Sub(now),
				err: fmt.Errorf("wait %s due at %s came early by this worker's clock", p.id, due.Format(time.RFC3339Nano))}
		}
		return h.end(c, p, expired(d, p.call, due))
	}
	// The wait's record comes before its hook token's: it is how the
	// token is found when the run's records expire (Expire).
	mark, err := h.markWait(p, state.Wait{Kind: w.Kind, Event: w.Event, Token: w.Token, Since: now, Until: w.deadline(now)})
	if err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	if w.Kind == state.StepHook {
		taken, err := h.e.registerHook(d, p.call)
		if err != nil {
			return &settlement{kind: settleRelease, err: err}
		}
		if taken != nil {
			return h.end(c, p, taken)
		}
	}
	deadline := mark.Until
	if !deadline.IsZero() && !deadline.After(now) {
		return h.end(c, p, expired(d, p.call, deadline))
	}
	if w.Kind != state.StepSleep {
		rec, err := h.e.lookup(d, p.id)
		if err != nil {
			return &settlement{kind: settleRelease, err: err}
		}
		if rec != nil {
			p.rec = rec
			c.hist.put(rec)
			return nil
		}
	}
	if err := h.scheduleWake(c, p, deadline, now); err != nil {
		return &settlement{kind: settleRelease, err: err}
	}
	return nil
}

// markWait writes w as the record of the wait p begins (state.Wait),
// create-if-absent, and returns the record stored: w, or the one the
// first beginning of the wait wrote, whose deadline stands — a holder that
// begins the wait again (it took the run over, or a recheck woke it)
// counts from the wait's first beginning, not from now.
func (h *holder) markWait(p *Pending, w state.Wait) (state.Wait, error) {
	w.V, w.StepID, w.Seq = state.Version, p.id, p.seq
	w.Since, w.Until = w.Since.UTC(), w.Until.UTC()
	b, err := state.Encode(w)
	if err != nil {
		return w, err
	}
	key := state.WaitKey(p.id)
	_, err = h.e.cfg.Assets.Attempts.Create(h.d.nctx, key, b)
	if err == nil {
		p.mark = &w
		return w, nil
	}
	if !errors.Is(err, jetstream.ErrExists) {
		return w, fmt.Errorf("jetflow: record the wait %s: %w", p.id, err)
	}
	v, _, err := h.e.cfg.Assets.Attempts.GetExisting(h.d.nctx, key)
	if err != nil {
		return w, fmt.Errorf("jetflow: read the wait %s: %w", p.id, err)
	}
	if w, err = state.DecodeWait(v); err != nil {
		return w, err
	}
	p.mark = &w
	return w, nil
}

// end commits rec as the end of wait p (create-if-absent: an event
// committed first stays) and gives p the committed record.
func (h *holder) end(c *Context, p *Pending, rec *state.Step) *settlement {
	stored, s := h.e.commitRecord(h.d, rec)
	if s != nil {
		return s
	}
	p.rec = stored
	c.hist.put(stored)
	return nil
}

// scheduleWake stores the timer that wakes the run for wait p: at its
// deadline, or, for a wait without one, a recheck due WaitRecheck after
// now. A holder that may not be the first to begin the wait (it took the
// run over) first looks for the timer an earlier one stored, and keeps
// it: its deadline was counted from the wait's first beginning. The
// holder woken by a recheck stores the next one.
func (h *holder) scheduleWake(c *Context, p *Pending, deadline, now time.Time) error {
	timer := jetstream.RunTimer(c.run.Workflow, p.id)
	recheck := h.timerOf(p) && h.d.task.Recheck
	if !h.clean && !recheck {
		waiting, err := jetstream.HasTimer(h.d.nctx, h.e.cfg.Assets.Timers, timer, false)
		if err != nil || waiting {
			return err
		}
	}
	t := state.StepTask(c.run, c.rev, p.id)
	t.Wake = true
	msgID := state.TaskMsgID(c.run, p.id+"#wake")
	if deadline.IsZero() {
		deadline, t.Recheck = now.Add(WaitRecheck), true
		msgID = p.id + "#recheck." + strconv.FormatInt(deadline.Unix(), 10)
	} else {
		t.WakeAt = deadline.UTC()
	}
	return h.e.storeTimer(h.d, timer, msgID, t, deadline)
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

// lookup reads the committed record of stepID, or nil.
func (e *Executor) lookup(d *delivery, stepID string) (*state.Step, error) {
	v, rev, err := e.cfg.Assets.Steps.Get(d.nctx, stepID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rec, err := state.DecodeStep(v)
	if err != nil {
		return nil, err
	}
	rec.Rev = rev
	if d.waived(&rec) {
		return nil, nil
	}
	return &rec, nil
}

// waived reports whether rec is a record an operator told d's run to go
// on without (history.waive): as if not committed.
func (d *delivery) waived(rec *state.Step) bool {
	rev := d.run.WaivedRev[rec.StepID]
	return rev != 0 && rec.Rev == rev && slices.Contains(d.run.Waived, rec.StepID)
}
