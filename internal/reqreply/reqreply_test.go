package reqreply_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/reqreply"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

func TestCheckReply(t *testing.T) {
	t.Parallel()
	require.NoError(t, reqreply.CheckReply("_INBOX.abc.1"))
	for _, bad := range []string{"", "_INBOX.", "$KV.jetflow_runs.victim", "jetflow.task.wf.run", "_INBOX.>", "_INBOX.*", "x._INBOX.a"} {
		require.ErrorIs(t, reqreply.CheckReply(bad), reqreply.ErrNotInbox, bad)
	}
}

// TestRequestWithForeignReplyIsNotAnswered: a request whose reply subject
// names a subject other than an inbox (a KV key its sender may not write)
// gets no answer there; a request that comes after it on the same
// connection is answered, so the first was handled (and dropped) by then.
func TestRequestWithForeignReplyIsNotAnswered(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	worker, sender, victim := testenv.Conn(t, srv), testenv.Conn(t, srv), testenv.Conn(t, srv)
	// One request at a time: the forged one is answered (if at all)
	// before the real one, on the same connection.
	stop, err := reqreply.Serve(worker, "q", []string{"svc.a"}, 1, testenv.Logger(t), func(m *nats.Msg) []byte {
		return append([]byte("answer to "), m.Data...)
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stop()) })
	landed, err := victim.SubscribeSync("$KV.jetflow_runs.>")
	require.NoError(t, err)
	require.NoError(t, victim.Flush())

	require.NoError(t, sender.PublishRequest("svc.a", "$KV.jetflow_runs.victim", []byte("forged")))
	m, err := sender.Request("svc.a", []byte("real"), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "answer to real", string(m.Data))
	require.NoError(t, worker.Flush())
	require.NoError(t, victim.Flush())
	_, err = landed.NextMsg(0)
	require.ErrorIs(t, err, nats.ErrTimeout, "the forged request's answer was published on its reply subject")
}
