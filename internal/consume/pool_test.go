package consume

import (
	"testing"
	"time"
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
