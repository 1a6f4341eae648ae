package jetflow

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Default worker names differ between workers of one process: they are
// what step records and logs name.
func TestDefaultWorkerNamesDiffer(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 50 {
		name := WorkerConfig{}.WithDefaults().Name
		require.False(t, seen[name], "name %s given twice", name)
		seen[name] = true
	}
}
