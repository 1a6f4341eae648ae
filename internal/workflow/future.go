package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jetflow/jetflow/internal/state"
)

// ErrForeignFuture: a future awaited in a run other than the one that
// started it (or in another replay of it).
var ErrForeignFuture = errors.New("jetflow: future started by another run")

// ErrNotAwaited: the outcome of a future no Await has seen committed.
var ErrNotAwaited = errors.New("jetflow: future not awaited")

// Pending is a step (or a child run) the body started with Start or
// StartChild whose result may not be known yet. Result, or Await over
// several, waits for it.
//
// # How a run with steps in flight advances
//
// Awaits cut the body into epochs: the steps started between two awaits
// belong to the same epoch. When a replay parks at an await that cannot
// return yet, the task publishes the tasks of every started step that is
// not committed and was started in an epoch after the one of the step
// this task executed (all of them when it executed none): those are the
// steps only this replay has reached. A step of an earlier epoch already
// has its task, published by whoever opened that epoch, and that task,
// once its step is committed, replays to the same await. The last of the
// awaited steps to commit therefore reads the others as committed (reads
// of the steps bucket see every acknowledged write) and goes on; several
// that commit together may all go on, and the tasks they publish are the
// same tasks under the same message IDs, so the broker keeps one.
//
// A start task is the one exception to "a step's task was published by
// whoever reached it": it owns the run's first step without anyone having
// published the steps started beside it. It publishes them at the body's
// first await and only then runs its own step (runOwn). A future never
// awaited before the body returns is never published by that rule: it is
// abandoned with the run.
type Pending struct {
	c     *Context
	name  string
	id    string
	seq   int
	epoch int
	call  *stepCall
	rec   *state.Step // committed record once known
	// dispatched: this replay has published its task already.
	dispatched bool
}

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

// Result waits for p and returns its committed result (Await, then
// Outcome).
func (c *Context) Result(p *Pending) (json.RawMessage, error) {
	if _, err := c.Await([]*Pending{p}, false); err != nil {
		return nil, err
	}
	return p.Outcome()
}

// Start starts the next call of the step called name without waiting for
// it and returns its handle. Its ID depends only on how many steps called
// name the body started before. This task runs it now when it owns it (and
// it is not committed); otherwise its task is published when the body
// parks. Invalid arguments are returned as errors; a step this task had to
// retry or release does not return (see StepWithKey).
func (c *Context) Start(name string, policy RetryPolicy, key TaskKey, fn StepFunc) (*Pending, error) {
	if c.parked {
		// A Step the body deferred, running while the body unwinds: unwind
		// on, without touching NATS or settling again.
		c.park(nil)
	}
	if err := state.ValidateName(name); err != nil {
		return nil, err
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if wrap := c.exec.cfg.Hooks.WrapStep; wrap != nil {
		fn = wrap(c.run.Workflow, name, fn)
	}
	p := c.next(name)
	p.call = &stepCall{name: name, id: p.id, seq: p.seq, policy: policy.WithDefaults(), taskKey: key, fn: fn}
	c.begin(p)
	return p, nil
}

// StartChild starts the next call of the child step called name, which
// starts the child run spec without waiting for it. The child's run ID is
// spec.RunID, or derived from the parent's run and the step's name and
// occurrence. An invalid name, run ID or input is returned as an error.
func (c *Context) StartChild(name string, spec ChildSpec) (*Pending, error) {
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

// next allocates the handle of the next call of step name: its occurrence,
// its place in the order the body starts steps, and its epoch.
func (c *Context) next(name string) *Pending {
	occ := c.occ[name]
	c.occ[name] = occ + 1
	p := &Pending{c: c, name: name, seq: c.seq, epoch: c.epoch,
		id: state.StepID(state.RunIdentity(c.run.RunID, c.run.Generation), name, occ)}
	c.seq++
	c.started = append(c.started, p)
	return p
}

// begin runs p now when this task owns it: its own step that is not
// committed yet. A start task owns the run's first step, which no one has
// published the steps started beside it for: it runs that step at the
// body's first await, after publishing them (runOwn).
//
// A child run's start task owns no step: the child is part of a run in
// progress, so its first step runs as a step task, not in one of the few
// slots a worker keeps for starting runs.
func (c *Context) begin(p *Pending) {
	if c.check != nil {
		c.check.begin(c, p)
		return
	}
	startsRun := c.task.StepID == "" && p.seq == 0 && c.run.Parent == nil
	if c.executed || c.own != nil || !(c.task.StepID == p.id || startsRun) {
		return
	}
	if c.task.StepID != "" && p.call.child == nil && p.call.wait == nil {
		// A step task reads the run's record before its step starts (the
		// cancel check); the read goes out beside the step's, not after it.
		p.call.checked = c.exec.checkRunning(c.delivery)
	}
	rec, err := c.exec.lookup(c.nctx, c.runKey(), p.id)
	if err != nil {
		c.park(&settlement{kind: settleRelease, err: err})
	}
	if rec != nil {
		p.rec = rec
		return
	}
	if c.task.StepID == "" {
		c.own = p
		return
	}
	c.execute(p)
}

// execute runs p, this task's own step, and records its result on p (nil
// for a child that still runs); a step that is not to be committed now
// (a retry, a release, a drop) parks the body.
func (c *Context) execute(p *Pending) {
	var (
		rec   *state.Step
		s     *settlement
		found bool // committed before its function ran: this task ran nothing
	)
	switch {
	case p.call.child != nil:
		rec, s = c.exec.startChild(c.delivery, p.call)
	case p.call.wait != nil:
		rec, s = c.exec.startWait(c.delivery, p.call)
	default:
		rec, s, found = c.exec.execute(c.delivery, p.call)
	}
	if !found {
		c.executed, c.ownEpoch, c.mine = true, p.epoch, p
	}
	if s != nil {
		c.park(s)
	}
	p.rec = rec
}

// runOwn runs the start task's own step, which begin left for the first
// await: it first publishes the tasks of the steps started beside it, so
// that they run while it does.
func (c *Context) runOwn() {
	own := c.own
	c.own = nil
	var ids []string
	for _, p := range c.started {
		if p != own && p.rec == nil {
			ids = append(ids, p.id)
			p.dispatched = true
		}
	}
	if len(ids) > 0 {
		// The run's record was read before the replay; with the others
		// published first, read it again before the step starts.
		own.call.recheck = true
		if id, err := c.exec.dispatch(c.nctx, c.delivery, ids, true); err != nil {
			c.park(&settlement{kind: settleRelease, err: fmt.Errorf("publish task of %s: %w", id, err)})
		}
	}
	c.execute(own)
}

// Await waits for ps: for all of them, or, with first, for the first to
// be committed, whose index it returns (the same on every replay: commits
// are ordered by their revision in the steps bucket). It does not return
// while what it waits for is not committed: the body parks and the task is
// settled. Each future's result is then read with Committed or Result.
func (c *Context) Await(ps []*Pending, first bool) (int, error) {
	if c.parked {
		c.park(nil)
	}
	for _, p := range ps {
		if p == nil || p.c != c {
			return -1, ErrForeignFuture
		}
	}
	if c.own != nil {
		c.runOwn()
	}
	if len(ps) == 0 {
		return -1, nil
	}
	var (
		won int
		s   *settlement
	)
	if first {
		won, s = c.awaitFirst(ps)
	} else {
		won, s = -1, c.awaitAll(ps)
	}
	if s != nil {
		c.park(s)
	}
	c.epoch++
	if c.mine != nil && slices.Contains(ps, c.mine) {
		c.settledEpoch = c.epoch
	}
	return won, nil
}

// awaitAll returns nil when every one of ps is committed, or the
// settlement to park on. It looks at the latest started first: the one
// least likely to be committed, so that a branch that is not the last
// finds out with one read.
func (c *Context) awaitAll(ps []*Pending) *settlement {
	for i := len(ps) - 1; i >= 0; i-- {
		p := ps[i]
		if p.rec != nil {
			continue
		}
		rec, err := c.find(p, false)
		if err != nil {
			return &settlement{kind: settleRelease, err: err}
		}
		if rec == nil {
			return c.frontier()
		}
		p.rec = rec
	}
	return nil
}

// awaitFirst returns the index of the one of ps committed first, or the
// settlement to park on when none is. Every one of ps is read: a replay
// that saw only a later commit would pick another winner. The ones not
// committed are read once more after a commit was seen, so that any commit
// older than the oldest seen is seen too.
func (c *Context) awaitFirst(ps []*Pending) (int, *settlement) {
	seen := false
	for round := 0; round < 2; round++ {
		for _, p := range ps {
			if p.rec != nil {
				seen = true
				continue
			}
			rec, err := c.find(p, true)
			if err != nil {
				return -1, &settlement{kind: settleRelease, err: err}
			}
			if rec != nil {
				p.rec, seen = rec, true
			}
		}
		if !seen {
			return -1, c.frontier()
		}
	}
	won := -1
	for i, p := range ps {
		if p.rec != nil && (won < 0 || p.rec.Rev < ps[won].rec.Rev) {
			won = i
		}
	}
	return won, nil
}

// find returns p's committed record, or nil. A step started right after
// the await that returned this task's own step, just committed, is looked
// up in the cache only, unless exact is set: any other task that reached
// it passed that await after this commit, and the step's own task carries
// the run on if it has committed, so taking it for not committed only
// publishes its task again (absorbed). A step started later, or after an
// await that did not wait for this task's step, is read: tasks parked at
// an await this replay must pass may be waiting for it to see it.
func (c *Context) find(p *Pending, exact bool) (*state.Step, error) {
	if c.executed && p.epoch == c.settledEpoch && !exact {
		if rec, ok := c.exec.cache.get(c.runKey(), p.id); ok {
			return rec, nil
		}
		return nil, nil
	}
	return c.exec.lookup(c.nctx, c.runKey(), p.id)
}

// frontier is the settlement of a replay that parks at an await: publish
// the task of every started step not known to be committed that only this
// replay has reached (see Pending), then acknowledge.
func (c *Context) frontier() *settlement {
	// A run parked at the wait this task has just begun may wait for days:
	// its history leaves the cache.
	waiting := c.mine != nil && c.mine.call.wait != nil && c.mine.rec == nil
	s := &settlement{kind: settleDispatch, ranStep: c.executed, forget: waiting}
	for _, p := range c.started {
		if p.rec != nil || p.dispatched || (c.executed && p.epoch <= c.ownEpoch) {
			continue
		}
		if !c.executed {
			// A replay that ran nothing (a redelivery, a redispatch, a
			// sweep) reads before it publishes: most of what it finds is
			// committed or in flight.
			rec, err := c.exec.lookup(c.nctx, c.runKey(), p.id)
			if err != nil {
				return &settlement{kind: settleRelease, err: err}
			}
			if rec != nil {
				p.rec = rec
				continue
			}
		}
		s.stepIDs = append(s.stepIDs, p.id)
	}
	return s
}
