package state

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A scope outside the constants is an invalid task key, never a default.
func TestValidateKeyScope(t *testing.T) {
	t.Parallel()
	for _, s := range []KeyScope{ScopeRun, ScopeWorkflow, ScopeGlobal} {
		require.NoError(t, ValidateKeyScope(s))
	}
	for _, bad := range []KeyScope{-1, 3, 9} {
		err := ValidateKeyScope(bad)
		require.ErrorIs(t, err, ErrInvalidTaskKey)
		require.EqualError(t, err, fmt.Sprintf("jetflow: invalid task key: KeyScope(%d)", int(bad)))
	}
}
