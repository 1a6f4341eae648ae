package jetflowtest

import (
	"testing"

	"go.uber.org/goleak"
)

// Main runs the tests of m and fails if goroutines are left over once they
// have ended, ignoring those the embedded nats-server keeps for the
// process. Call it from TestMain:
//
//	func TestMain(m *testing.M) { jetflowtest.Main(m) }
func Main(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ipQueue[...]).pop"),
		goleak.IgnoreTopFunction("time.Sleep"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
