package workflow

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// hold's decision table, row by row, and the rows' order where two match.
func TestHoldDecisionTable(t *testing.T) {
	t.Parallel()
	const seq, rev = 7, 40
	held := func(seq uint64, delivered int) state.Lease {
		return state.Lease{State: state.LeaseHeld, Seq: seq, Delivered: delivered}
	}
	for _, tc := range []struct {
		name      string
		has       bool
		found     state.Lease
		stale     uint64
		delivered int
		want      leaseFound
	}{
		{"1: cancelled, whoever reads it", true, state.Lease{State: state.LeaseCancelled, Seq: seq, Delivered: 9}, 0, 1, foundCancelled},
		{"2: this message's later delivery holds it", true, held(seq, 3), 0, 2, foundLater},
		{"2 before 5: a later delivery's hold is not waited out", true, held(seq, 3), 0, 1, foundLater},
		{"3: handed back unstarted by the delivery just before", true, state.Lease{State: state.LeaseReleased, Unstarted: true, Seq: seq, Delivered: 1}, 0, 2, foundHandedBack},
		{"3 only for the next delivery: later ones take over", true, state.Lease{State: state.LeaseReleased, Unstarted: true, Seq: seq, Delivered: 1}, 0, 3, foundStale},
		{"4: first delivery, no lease record", false, state.Lease{}, 0, 1, foundFree},
		{"4: first delivery, another message parked it", true, state.Lease{State: state.LeaseParked, Seq: seq - 1, Delivered: 2}, 0, 1, foundFree},
		{"4: first delivery, another message released it", true, state.Lease{State: state.LeaseReleased, Seq: seq - 1, Delivered: 1}, 0, 1, foundFree},
		{"5: first delivery, another message holds it", true, held(seq-1, 1), 0, 1, foundHeld},
		{"5: a redelivery, an earlier delivery of this message holds it", true, held(seq, 1), 0, 2, foundHeld},
		{"6: held, and found stale by waitOut", true, held(seq-1, 1), rev, 1, foundStale},
		{"6: held by this very delivery (its own record)", true, held(seq, 2), 0, 2, foundStale},
		{"6: a redelivery, no lease record", false, state.Lease{}, 0, 2, foundStale},
		{"6: this message's delivery before parked it", true, state.Lease{State: state.LeaseParked, Seq: seq, Delivered: 1}, 0, 2, foundStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, holdDecision(tc.has, tc.found, rev, tc.stale, seq, tc.delivered))
		})
	}
}
