package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// The cluster helper itself: an R3 stream gets a leader, loses it when its
// node stops, keeps its messages through the failover and the restart, and
// leaderships can be placed on a chosen node.
func TestClusterStopRestartKeepsStreams(t *testing.T) {
	t.Parallel()
	c := NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := natsjs.New(c.Conn(t, -1))
	require.NoError(t, err)
	// A publish whose answer is lost (its connection's node stopped while
	// it was out) is sent again, under its message ID, until ctx ends.
	publish := func(subject, id string) {
		t.Helper()
		for {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := js.Publish(actx, subject, []byte(id), natsjs.WithMsgID(id))
			acancel()
			if err == nil || ctx.Err() != nil {
				require.NoError(t, err, "publish %s", id)
				return
			}
			t.Logf("publish %s: %v; sending it again", id, err)
			select { // a refusal comes at once: not in a tight loop
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	_, err = js.CreateStream(ctx, natsjs.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	require.NoError(t, err)

	c.MoveLeader(c.Conn(t, 1), "S", 2)
	require.Equal(t, 2, c.StreamLeader("S"))
	for i := range 10 {
		publish("s.a", fmt.Sprint("a-", i))
	}

	c.Stop(2)
	require.Nil(t, c.Server(2))
	leader := c.StreamLeader("S")
	require.NotEqual(t, 2, leader)
	for i := range 10 {
		publish("s.b", fmt.Sprint("b-", i))
	}

	c.Restart(2)
	require.NotNil(t, c.Server(2))
	c.MoveLeader(c.Conn(t, 0), "S", 2)
	s, err := js.Stream(ctx, "S")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(20), info.State.Msgs, "no message lost; the restarted node leads with all of them")
	require.Equal(t, c.Name(2), info.Cluster.Leader)
	// A follower catches up with the new leader after the move; on a busy
	// machine that can take a moment, so wait for it (within ctx).
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		if err != nil || info.Cluster.Leader != c.Name(2) || len(info.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "replicas did not catch up with the restarted leader")
}
