package jetflow

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The options record an enum value outside its constants as an error for
// the start or the step call to return: an unknown value is an error,
// never a default.
func TestOptionsRefuseUnknownEnumValues(t *testing.T) {
	t.Parallel()
	for _, bad := range []FingerprintMode{-1, 2, 99} {
		var o startOptions
		WithFingerprintMode(bad)(&o)
		require.ErrorIs(t, o.err, ErrInvalidConflictPolicy, "%d", bad)
		require.ErrorContains(t, o.err, fmt.Sprintf("FingerprintMode(%d)", bad))
		require.False(t, o.ignoreInput)
	}
	var o startOptions
	WithFingerprintMode(FingerprintIgnore)(&o)
	require.NoError(t, o.err)
	require.True(t, o.ignoreInput)

	for _, bad := range []KeyScope{-1, 3, 9} {
		var o stepOptions
		WithKeyScope(bad)(&o)
		require.ErrorIs(t, o.err, ErrInvalidKey, "%d", bad)
		require.ErrorContains(t, o.err, fmt.Sprintf("KeyScope(%d)", bad))
	}
	var so stepOptions
	WithKeyScope(ScopeGlobal)(&so)
	require.NoError(t, so.err)
	require.Equal(t, ScopeGlobal, so.taskKey.Scope)
}

// An unknown scope prints as its number; the names are the engine's.
func TestUnknownEnumValuesPrint(t *testing.T) {
	t.Parallel()
	require.Equal(t, "KeyScope(-1)", KeyScope(-1).String())
	require.Equal(t, "workflow", ScopeWorkflow.String())
	var zero KeyScope
	require.Equal(t, ScopeRun, zero, "the zero value is the run scope")
}
