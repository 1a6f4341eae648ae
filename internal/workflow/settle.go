package workflow

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// settleKind is how a task message is settled once its replay has ended.
type settleKind int

const (
	// settleFinish: the body returned; record the run's end, then ack.
	settleFinish settleKind = iota + 1
	// settlePark: the body waits for what epoch's await awaits (waits);
	// write the lease parked, look once more, then ack, or nak when the
	// await can be decided now (runsettle.go).
	settlePark
	// settleRetry: a step failed and runs again after delay: the holder
	// waits in place or parks on a timer, a branch naks or stores a timer.
	settleRetry
	// settleRelease: leave the task to another delivery soon (shutdown,
	// a NATS failure), after delay when set, ReleaseDelay otherwise.
	// Nothing was committed by this attempt.
	settleRelease
	// settleDrop: the task has nothing (more) to do: acknowledge it.
	settleDrop
	// settleLost: the holder's lease was taken over: the message belongs
	// to another delivery now; leave it alone.
	settleLost
	// settleDone: a branch task committed its step (rec): wake the run,
	// then ack.
	settleDone
	// settleBlock: the body diverged from the run's history (divergence):
	// block the run, then ack (block.go).
	settleBlock
	// settleStray: a start task stored after the run was parked
	// (roleStray): ack it without a replay, then look at what the run
	// awaits (strayLook).
	settleStray
)

// errNotThisTask: a task that must not run its step: a redispatched branch
// task while a retry timer of the step is waiting, or a retry whose attempt
// already ran.
var errNotThisTask = errors.New("jetflow: not this task's step to run")

// settlement is the outcome of handling one task, decided by the replay and
// carried out by the task's handler. Every function that can end a task's
// replay early returns one instead of unwinding; only Context.park hands
// it over.
type settlement struct {
	kind settleKind
	// finish
	output json.RawMessage
	panic  bool
	err    error // workflow error (finish) or cause (release, retry, drop)
	// release, retry
	delay time.Duration
	// release: a branch task's replay reached an await its history does
	// not satisfy before the branch's step.
	unreached bool
	// drop: the task is work this worker leaves undone (not a task with
	// nothing left to do): logged at warn.
	warn bool
	// release: a draining holder hands the run over before the step it
	// reached starts (lease.handOver).
	handOver bool
	// retry: the attempt that failed, when it started, and its step.
	attempt int
	started time.Time
	stepID  string
	// park: the await's number, the steps it waits for (the first of them
	// for first), and their handles, for the look after the ack.
	epoch int
	waits []*Pending
	first bool
	// park: the await began what it waits for (not a sequential step's
	// retry): state.Lease.Began; begun: the other steps begun and not
	// committed (state.Lease.Begun).
	began bool
	begun []*Pending
	// done: the branch's committed record.
	rec *state.Step
	// block: the divergence report.
	divergence *jetflowtype.Divergence
}

// lostOr is the settlement of an error from the lease or a step that lost
// it: lost or dropped (cancelled) when err says so, else a release.
func lostOr(err error) *settlement {
	switch {
	case errors.Is(err, errLeaseLost):
		return &settlement{kind: settleLost, err: err}
	case errors.Is(err, errLeaseCancelled):
		return &settlement{kind: settleDrop, err: err}
	}
	return &settlement{kind: settleRelease, err: err}
}

// stepIDs are the IDs of ps.
func stepIDs(ps []*Pending) []string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.id
	}
	return ids
}
