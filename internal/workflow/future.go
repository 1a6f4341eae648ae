package workflow

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jetflow/jetflow/internal/state"
)

// ErrForeignFuture: a future awaited in a run other than the one that
// started it (or in another replay of it).
var ErrForeignFuture = errors.New("jetflow: future started by another run")

// ErrNotAwaited: the outcome of a future no Await has seen committed.
var ErrNotAwaited = errors.New("jetflow: future not awaited")

// Pending is a step (or a child run, or a wait) the body started with
// Start, StartChild or StartWait, whose result may not be known yet.
// Result, or Await over several, waits for it.
//
// # Sequential steps and branches
//
// Every await classifies the steps started since the await before it (the
// open steps), from the body's calls alone, so that every replay
// classifies them the same way:
//
//   - a step function that is the only open step function and is awaited
//     now is sequential: the holder runs it in place, inline, and commits
//     it under its lease (Step, and Go followed at once by Get);
//   - every other open step function is a branch: it runs as a task of
//     its own (branch.go), on any worker, and its commit wakes the run;
//   - waits and children are begun by the holder (wait.go, child.go).
//
// A step once classified a branch stays one on every replay, whoever
// committed it: a holder never commits a branch, nor a branch task a
// sequential step.
type Pending struct {
	c    *Context
	name string
	id   string
	seq  int
	// epoch is the number of awaits the body had reached when it started
	// the step.
	epoch int
	call  *stepCall
	class class
	rec   *state.Step // committed record once known
	// mark is the record of the wait (or child) p, when this replay wrote
	// or found it (markWait); decided: an await of this replay has decided
	// on p (see holder.passed).
	mark    *state.Wait
	decided bool
}

// class is what an await decided a step is (see Pending).
type class int

const (
	classOpen   class = iota // not classified yet
	classInline              // a sequential step function: the holder runs it
	classBranch              // a step function run as a branch task
	classWait                // a sleep, an event or hook wait
	classChild               // a child run
)

// StepID is the step's deterministic ID.
func (p *Pending) StepID() string { return p.id }

// Name is the step's name.
func (p *Pending) Name() string { return p.name }

// Outcome is the committed result of a step an Await has seen committed:
// its output, or its final failure as a *StepError. Before that it is
// ErrNotAwaited.
func (p *Pending) Outcome() (json.RawMessage, error) {
	if p.rec == nil {
		return nil, ErrNotAwaited
	}
	return stepResult(p.rec)
}

// StepWithKey returns the committed result of the next call of the step
// called name, running fn to produce it when it is not committed yet:
// Start and Result of one step. A non-zero key makes the call go through a
// task idempotency key (see TaskKey). When the result cannot be known in
// this task, StepWithKey does not return: the workflow body is unwound
// (deferred calls run) and the task is settled.
//
// A step whose final failure is committed returns a *StepError, on every
// replay. Invalid arguments (name, policy, key) are returned as errors.
func (c *Context) StepWithKey(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (json.RawMessage, error) {
	// One call of the body: its goroutine is checked once (the check
	// reads the goroutine's stack header, a microsecond or two).
	if err := c.onBody(); err != nil {
		return nil, err
	}
	p, err := c.start(name, policy, key, fn)
	if err != nil {
		return nil, err
	}
	if _, err := c.await([]*Pending{p}, false); err != nil {
		return nil, err
	}
	return p.Outcome()
}

// Result waits for p and returns its committed result (Await, then
// Outcome).
func (c *Context) Result(p *Pending) (json.RawMessage, error) {
	if _, err := c.Await([]*Pending{p}, false); err != nil {
		return nil, err
	}
	return p.Outcome()
}

// stepResult turns a committed record into what a step call returns.
func stepResult(rec *state.Step) (json.RawMessage, error) {
	if rec.Error != nil {
		return nil, &StepError{
			RunID: rec.RunID, StepID: rec.StepID, StepName: rec.Name,
			Attempts: rec.Attempt, Fatal: rec.Error.Fatal, Code: rec.Error.Code, Message: rec.Error.Message,
			ChildRunID: rec.Child, ChildStatus: childStatus(rec.Error.Kind),
		}
	}
	return rec.Output, nil
}

// childStatus is how the child of a child step whose failure has kind
// ended; empty for a step's own failure and a child that was not started.
func childStatus(kind string) state.Status {
	switch kind {
	case KindChildFailed:
		return state.StatusFailed
	case KindChildCancelled:
		return state.StatusCancelled
	}
	return ""
}

// Start starts the next call of the step called name without waiting for
// it and returns its handle. Its ID depends only on how many steps called
// name the body started before. Whether it runs inline or as a branch is
// decided at the next await (see Pending). Invalid arguments are returned
// as errors.
func (c *Context) Start(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (*Pending, error) {
	if err := c.onBody(); err != nil {
		return nil, err
	}
	return c.start(name, policy, key, fn)
}

// start is Start once the caller is known to be the body's goroutine.
func (c *Context) start(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (*Pending, error) {
	if c.parked {
		// A Step the body deferred, running while the body unwinds: unwind
		// on, without touching NATS or settling again.
		c.park(nil)
	}
	if err := state.ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateRetry(policy); err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if wrap := c.exec.cfg.Hooks.WrapStep; wrap != nil && c.mode != modeCheck {
		fn = wrap(c.run.Workflow, name, fn)
	}
	p := c.next(name)
	p.call = &stepCall{name: name, id: p.id, seq: p.seq, policy: RetryWithDefaults(policy), taskKey: key, fn: fn}
	c.begin(p)
	return p, nil
}

// StartChild starts the next call of the child step called name, which
// starts the child run spec without waiting for it. The child's run ID is
// spec.RunID, or derived from the parent's run and the step's name and
// occurrence. An invalid name, run ID or input is returned as an error.
func (c *Context) StartChild(name string, spec ChildSpec) (*Pending, error) {
	if err := c.onBody(); err != nil {
		return nil, err
	}
	if c.parked {
		c.park(nil)
	}
	if err := state.ValidateName(name); err != nil {
		return nil, err
	}
	if err := state.ValidateName(spec.Workflow); err != nil {
		return nil, err
	}
	if !json.Valid(spec.Input) {
		return nil, fmt.Errorf("%w: child input is not JSON", ErrInput)
	}
	if len(spec.Input) > state.MaxInputBytes {
		return nil, fmt.Errorf("%w: child input of %d bytes, limit %d", state.ErrInputTooLarge, len(spec.Input), state.MaxInputBytes)
	}
	if spec.RunID != "" {
		if err := state.ValidateRunID(spec.RunID); err != nil {
			return nil, err
		}
	}
	p := c.next(name)
	if spec.RunID == "" {
		spec.RunID = state.ChildRunID(c.run.RunID, c.run.Generation, name, state.Occurrence(p.id))
	}
	p.call = &stepCall{name: name, id: p.id, seq: p.seq, child: &spec}
	c.begin(p)
	return p, nil
}

// StartWait starts the next wait of the body: a sleep (its step is called
// name), or a wait for the event spec.Event (its step is called
// state.EventStepName or state.HookStepName of the event, so that no step
// the body names can be committed by a sender). Like Start, it returns the
// handle at once; Await or Result waits. Invalid arguments are returned as
// errors.
func (c *Context) StartWait(name string, spec WaitSpec) (*Pending, error) {
	if err := c.onBody(); err != nil {
		return nil, err
	}
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

// next allocates the handle of the next call of step name: its occurrence,
// its place in the order the body starts steps, its epoch, and its record
// when the delivery's history holds one.
func (c *Context) next(name string) *Pending {
	occ := c.occ[name]
	c.occ[name] = occ + 1
	p := &Pending{c: c, name: name, seq: c.seq, epoch: c.epoch,
		id: state.StepID(state.RunIdentity(c.run.RunID, c.run.Generation), name, occ)}
	c.seq++
	if c.hist != nil {
		p.rec = c.hist.get(p.id)
	}
	c.started = append(c.started, p)
	return p
}

// begin hands p to the mode: a replay check records it, a branch task runs
// it when it is its own step (and never returns then), a holder leaves it
// open for the next await to classify.
func (c *Context) begin(p *Pending) {
	switch c.mode {
	case modeCheck:
		c.open = append(c.open, p)
		c.check.begin(c, p)
	case modeBranch:
		c.open = append(c.open, p)
		if p.id == c.branch {
			if d := c.divergent(c.open, false); d != nil {
				c.park(c.blocked(d))
			}
			c.park(c.exec.runBranch(c, p))
		}
	default:
		c.open = append(c.open, p)
	}
}

// Await waits for ps: for all of them, or, with first, for the first to
// be committed, whose index it returns (the same on every replay: commits
// are ordered by their revision in the steps bucket). It does not return
// while what it waits for is not committed in this task: the body parks
// and the task is settled. Each future's result is then read with Outcome
// or Result.
func (c *Context) Await(ps []*Pending, first bool) (int, error) {
	if err := c.onBody(); err != nil {
		return -1, err
	}
	return c.await(ps, first)
}

// await is Await once the caller is known to be the body's goroutine.
func (c *Context) await(ps []*Pending, first bool) (int, error) {
	if c.parked {
		c.park(nil)
	}
	for _, p := range ps {
		if p == nil || p.c != c {
			return -1, ErrForeignFuture
		}
	}
	c.epoch++
	var (
		won int
		s   *settlement
	)
	switch c.mode {
	case modeHolder:
		won, s = c.hold.advance(c, ps, first)
	default:
		// A replay check gives every step a record; a branch task passes
		// only awaits its history satisfies (its step is started before
		// the await that waits for it), and goes no further than its
		// history allows.
		if d := c.divergent(c.open, true); d != nil {
			c.park(c.blocked(d))
		}
		c.open = nil
		var ok bool
		if won, ok = decide(ps, first); !ok {
			s = &settlement{kind: settleRelease, unreached: true, err: fmt.Errorf("the body awaits %v before step %s, not committed: the run's history changed, or the body does not replay the same way", stepIDs(ps), c.branch)}
		}
	}
	if s != nil {
		c.park(s)
	}
	return won, nil
}

// decide reports whether an await of ps is satisfied by the records known
// of them, and for first which one won: the one committed first (lowest
// revision). An empty await is satisfied (-1).
func decide(ps []*Pending, first bool) (int, bool) {
	if len(ps) == 0 {
		return -1, true
	}
	won := -1
	for i, p := range ps {
		switch {
		case p.rec == nil && !first:
			return -1, false
		case p.rec == nil:
		case won < 0 || p.rec.Rev < ps[won].rec.Rev:
			won = i
		}
	}
	if first {
		return won, won >= 0
	}
	return -1, true
}
