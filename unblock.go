package jetflow

import (
	"context"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// UnblockOptions says how UnblockRun moves a blocked run on.
type UnblockOptions struct {
	// AcceptDivergence waives the history's step that the run's block
	// names (Run.Block.Divergence: the step at the diverging place, or the
	// step the code starts out of place), so that the code's step at that
	// place runs: its side effect happens again, under a new step ID
	// unless the step kept its name. Without it the run is replayed with
	// the code the workers run now, and blocks again if that code still
	// diverges: deploy code that replays the history (a rollback, a fix)
	// first, or accept.
	AcceptDivergence bool
}

// UnblockOutcome is what UnblockRun did.
type UnblockOutcome struct {
	RunID string
	// Status is the run's state after the call: running.
	Status RunStatus
	// Waived is the step of the history the call waived (AcceptDivergence),
	// "" for none.
	Waived string
}

// UnblockRun moves on a run that its workers blocked because its code
// diverged from its history (StatusBlocked, Run.Block): the run is
// running again, and a worker replays it at once. A blocked run also goes
// on by itself when a worker whose code replays its history takes it (its
// recheck timer, and every worker of another build, offer it).
//
// A run that is not blocked is ErrRunNotBlocked (a repeat call after a
// successful one gets it), an unknown one ErrRunNotFound; accepting a
// divergence that names no step to waive is ErrNothingToWaive.
//
// Like CancelRun it writes the run's record and publishes a task, which
// needs the NATS user jetflow_operator under the least-privilege profile;
// a refused write is ErrPermissionDenied.
func (c *Client) UnblockRun(ctx context.Context, runID string, opts UnblockOptions) (out UnblockOutcome, err error) {
	ctx, stop := c.denials.watch(ctx, c.nc, unblockWrites...)
	defer stop()
	defer func() {
		err = jetstream.Unavailable(deniedErr(ctx, err, "an unblock needs the NATS user jetflow_operator (deploy/nats/accounts.conf)"))
	}()
	if err := state.ValidateRunID(runID); err != nil {
		return UnblockOutcome{}, err
	}
	run, waived, err := workflow.Unblock(ctx, c.assets, c.runs, runID, opts.AcceptDivergence)
	out = UnblockOutcome{RunID: runID, Status: RunStatus(run.Status), Waived: waived}
	return out, err
}

// unblockWrites are the subjects UnblockRun publishes to: the run record
// and the branch task a worker turns into the run's wake.
var unblockWrites = []string{
	"$KV." + jetstream.RunsBucket + ".",
	"jetflow.branch.",
}
