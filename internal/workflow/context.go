package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/jetflow/jetflow/jetflowtype"
)

type stepInfoKey struct{}

// InfoFrom returns the details of the step attempt running with ctx
// (jetflowtype.StepDetails, the root package's StepDetails).
func InfoFrom(ctx context.Context) (jetflowtype.StepDetails, bool) {
	info, ok := ctx.Value(stepInfoKey{}).(jetflowtype.StepDetails)
	return info, ok
}

// StepFunc is a type-erased step body: it returns the step's JSON result.
type StepFunc func(ctx context.Context) (json.RawMessage, error)

// mode is what a Context's replay is for.
type mode int

const (
	// modeHolder: the delivery holds the run's lease; it executes the body,
	// its sequential steps included (holder.go).
	modeHolder mode = iota
	// modeBranch: a branch task replays the body only as far as its own
	// step, which it runs (branch.go).
	modeBranch
	// modeCheck: a replay check, without NATS (check.go).
	modeCheck
)

// Context is the replay state of one run while one task is handled. The
// workflow body calls Start, StartChild, StartWait and Await through it;
// everything else about the run is read-only.
type Context struct {
	*delivery
	exec *Executor
	mode mode
	hist *history
	occ  map[string]int
	seq  int
	// epoch counts the awaits the body has reached (the current one's
	// number while it is in Await, counting from 1).
	epoch int
	// started are the steps the body started, in order; open are those
	// started since the last await, which classifies them (see Pending).
	started []*Pending
	open    []*Pending
	// parked is set once the body is being unwound (park): deferred Step
	// calls then unwind too, without touching NATS or settling again.
	parked bool
	done   chan *settlement
	// hold is the holder's state (modeHolder).
	hold *holder
	// branch is the branch task's step (modeBranch).
	branch string
	// check is the history of a replay check (modeCheck).
	check *checker
	// def is the definition being replayed; patched the answers of its
	// patch markers in this replay (Patched).
	def     Definition
	patched map[string]bool
	// goid is the body's goroutine (onBody).
	goid uint64
}

// Context is the worker's context: cancelled when the worker stops, the
// run is cancelled or the holder loses its lease.
func (c *Context) Context() context.Context { return c.ctx }

// RunID is the ID of the run being executed.
func (c *Context) RunID() string { return c.run.RunID }

// Workflow is the workflow name.
func (c *Context) Workflow() string { return c.run.Workflow }

// newContext is the replay state of d in mode m over history h.
//
// The records of steps the run's record says to go on without
// (state.Run.Waived) are left out of h.
func (e *Executor) newContext(d *delivery, m mode, h *history) *Context {
	if h != nil && len(d.run.Waived) > 0 {
		h.waive(d.run.Waived, d.run.WaivedRev)
	}
	return &Context{delivery: d, exec: e, mode: m, hist: h, occ: make(map[string]int), done: make(chan *settlement, 1)}
}

// replay runs def's body against c until it returns (a finish
// settlement) or parks at a call it cannot go past in this task (see
// park), and returns how to settle the task.
func (c *Context) replay(def Definition) *settlement {
	c.spawn(def)
	return <-c.done
}

// spawn runs def's body on a goroutine of its own, which sends how it
// ended on c.done: its return, its panic, or the settlement it parked on.
func (c *Context) spawn(def Definition) {
	c.def = def
	go func() {
		c.goid = goid()
		defer func() {
			if r := recover(); r != nil {
				c.done <- &settlement{kind: settleFinish, panic: true,
					err: fmt.Errorf("workflow panicked: %v\n%s", r, debug.Stack())}
			}
		}()
		out, err := def.Run(c, c.run.Input)
		if d := c.returnDivergent(); d != nil {
			c.done <- c.blocked(d)
			return
		}
		if u := c.unawaited(); u != nil && c.mode != modeBranch {
			out, err = nil, &CodedError{Code: CodeUnawaited, Err: c.Misuse(u)}
		}
		c.done <- &settlement{kind: settleFinish, output: out, err: err}
	}()
}

// park hands s to the task's handler (unless the body is already parked;
// s may then be nil) and unwinds the workflow goroutine: the body's
// deferred calls run and the goroutine ends.
//
// park never returns: it unwinds the workflow goroutine with
// runtime.Goexit. It is the one place where the body is left without a
// return, because a call that cannot produce its result in this task must
// not return to user code; it is called from Start and Await only.
func (c *Context) park(s *settlement) {
	if !c.parked {
		c.parked = true
		c.done <- s
	}
	runtime.Goexit()
}
