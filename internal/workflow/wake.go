package workflow

import (
	"context"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Wake hands the body of run, read at revision rev, to a holder: it
// publishes a wake of the run (a run task that carries the run's fields)
// under msgID, about stepID, the step whose commit woke it ("" for none).
//
// It is the one way anything but the run's holder makes the run go on: a
// branch's commit, an event, a hook's resume, a child's end, and the
// sweeper (a due timer is a wake stored ahead of time). Whatever woke it, the holder that takes the
// wake replays the body and decides: nothing but a holder starts a step.
//
// A wake published while a run task is pending (a holder at work, or a
// wake not delivered yet) is absorbed by it: that task's holder sees the
// commit, or parks and then looks again. The one pending task that cannot
// absorb it, the parked holder's own from its look onwards (it is
// acknowledged, or handed back because the look found a commit, and the
// stream may not have removed it yet), is waited out
// (acknowledgedLeftover). A
// repeat within the broker's window under the same msgID is absorbed too;
// one stored after all only replays.
//
// A run of an earlier version's executor (no state.Run.Exec) is resumed
// the way that version's workers expect: with a resume task of the step on
// their task subjects.
func Wake(ctx context.Context, assets *jetstream.Assets, run state.Run, rev uint64, stepID, msgID string) (jetstream.Dedup, error) {
	t := state.StepTask(run, rev, stepID)
	if run.Exec != state.ExecLease {
		if stepID == "" {
			return jetstream.Stored, nil
		}
		t.Resume, t.Redispatched = true, true
		b, err := state.Encode(t)
		if err != nil {
			return jetstream.Stored, err
		}
		return jetstream.PublishTask(ctx, assets.JS, jetstream.LegacyResumeSubject(run.Workflow, stepID), stepID+".resume", b)
	}
	t.Wake = true
	b, err := state.Encode(t)
	if err != nil {
		return jetstream.Stored, err
	}
	identity := state.RunIdentity(run.RunID, run.Generation)
	subject := jetstream.RunSubject(run.Workflow, identity)
	wait, giveUp := 5*time.Millisecond, time.Now().Add(absorbLag)
	for {
		dedup, err := jetstream.PublishTask(ctx, assets.JS, subject, msgID, b)
		if err != nil || dedup != jetstream.PendingSubject {
			return dedup, err
		}
		leftover, err := acknowledgedLeftover(ctx, assets, identity, subject)
		if err != nil || !leftover || time.Now().After(giveUp) {
			return dedup, err
		}
		select {
		case <-ctx.Done():
			return dedup, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// absorbLag bounds how long Wake waits for a parked holder's task to leave
// the stream (see acknowledgedLeftover). Past it the task is taken for one
// whose holder died before its acknowledgement, or whose acknowledgement
// failed: its redelivery takes the run over and sees the commit; the
// sweeper is the last resort.
const absorbLag = 5 * time.Second

// acknowledgedLeftover reports whether the run task pending on subject
// absorbs nothing while the run is parked: the parked holder's own (that
// holder has made its last look at what it waits for, or is making it,
// and then acknowledges the task, whose removal from the stream can lag
// behind the acknowledgement's confirmation — on a cluster, the removal
// is replicated after it), or a stray start task, which its worker drops
// without a replay (startRole). A wake refused because of it would be
// absorbed by a task nobody replays. Any other pending task absorbs the
// wake: its holder sees the commit, or parks and looks again.
func acknowledgedLeftover(ctx context.Context, assets *jetstream.Assets, identity, subject string) (bool, error) {
	l, _, err := readLease(ctx, assets.Steps, identity)
	if err != nil || l == nil || l.State != state.LeaseParked {
		return false, err
	}
	replays, err := storedTaskReplays(ctx, assets, *l, subject)
	return !replays, err
}
