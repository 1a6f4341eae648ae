package jetflowtest

import (
	"testing"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// Main runs the tests of m and fails if goroutines are left over once they
// have ended, ignoring those the embedded nats-server keeps for the
// process. Call it from TestMain:
//
//	func TestMain(m *testing.M) { jetflowtest.Main(m) }
func Main(m *testing.M) { testenv.VerifyNoLeaks(m) }
