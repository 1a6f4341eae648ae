package inspector_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// testToken is the token of the tests that log in.
const testToken = "s3cret-token"

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
