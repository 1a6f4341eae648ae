package workflow

import (
	"testing"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// TestMain fails the package's tests when they leave goroutines behind:
// an executor's, a pool's or a wake's that outlives its test.
func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m)
}
