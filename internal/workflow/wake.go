package workflow

import (
	"context"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Wake hands the body of run, read at revision rev, to a holder: it
// publishes a wake of the run (a run task that carries the run's fields)
// under msgID, about stepID, the step whose commit woke it ("" for none).
//
// It is the one way anything but the run's holder makes the run go on: a
// branch's commit, an event, a hook's resume, a child's end, the look a
// holder takes after it parked, and the sweeper (a due timer is a wake
// stored ahead of time). Whatever woke it, the holder that takes the
// wake replays the body and decides: nothing but a holder starts a step.
//
// A wake published while a run task is pending (a holder at work, or a
// wake not delivered yet) is absorbed by it: that task's holder sees the
// commit, or parks and then looks again. A repeat within the broker's
// window under the same msgID is absorbed too; one stored after all only
// replays.
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
	return jetstream.PublishTask(ctx, assets.JS, jetstream.RunSubject(run.Workflow, state.RunIdentity(run.RunID, run.Generation)), msgID, b)
}
