package consume

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHeartbeatBeatsUntilStopped(t *testing.T) {
	t.Parallel()
	beats := make(chan struct{}, 16)
	stop := Heartbeat(5*time.Millisecond, func() { beats <- struct{}{} })
	for range 3 {
		select {
		case <-beats:
		case <-time.After(5 * time.Second):
			t.Fatal("heartbeat did not beat")
		}
	}
	stop()
	stop() // idempotent
}

// The pull loop's table, row by row, and the order of rows that overlap.
func TestPullDecisionTable(t *testing.T) {
	t.Parallel()
	const threshold = 4 // of 8 slots
	for _, tc := range []struct {
		name                                 string
		free, outstanding                    int
		halted, batches, gathering, gathered bool
		want                                 pullAction
	}{
		{"1: stopping or paused", 8, 0, true, true, false, false, pullWait},
		{"1: no free slot", 0, 8, false, true, false, false, pullWait},
		{"2: half the slots free, requests out", threshold, 3, false, true, true, false, pullRequest},
		{"3: a few free, nothing out, gathered", 1, 0, false, true, false, true, pullRequest},
		{"3: a few free, nothing out, a one-slot pool", 1, 0, false, false, false, false, pullRequest},
		{"4: a few free, nothing out: gather first", 1, 0, false, true, false, false, pullGather},
		{"5: a few free, requests out", 1, 5, false, true, false, false, pullWait},
		{"5: a few free, gathering", 1, 0, false, true, true, false, pullWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, pullDecision(tc.free, threshold, tc.outstanding, tc.halted, tc.batches, tc.gathering, tc.gathered))
		})
	}
}
