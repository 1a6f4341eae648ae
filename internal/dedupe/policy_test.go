package dedupe

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/jetflowtype"
)

// Every value of the conflict policy's enums is valid, and a value outside
// them is an error that names the field and the value, never a default.
func TestValidatePolicyRefusesUnknownValues(t *testing.T) {
	t.Parallel()
	for _, r := range []jetflowtype.WhileRunning{jetflowtype.Attach, jetflowtype.RejectWhileRunning, jetflowtype.Supersede} {
		for _, e := range []jetflowtype.AfterEnded{jetflowtype.ReturnExisting, jetflowtype.RejectAfterEnd, jetflowtype.StartNew} {
			require.NoError(t, ValidatePolicy(jetflowtype.ConflictPolicy{WhileRunning: r, AfterCompleted: e, AfterFailed: e}))
		}
	}
	for _, bad := range []jetflowtype.WhileRunning{-1, 3, 99} {
		err := ValidatePolicy(jetflowtype.ConflictPolicy{WhileRunning: bad})
		require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy)
		require.EqualError(t, err, fmt.Sprintf("jetflow: invalid conflict policy: WhileRunning(%d)", bad))
	}
	for _, bad := range []jetflowtype.AfterEnded{-1, 3, 99} {
		err := ValidatePolicy(jetflowtype.ConflictPolicy{AfterCompleted: bad})
		require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy)
		require.EqualError(t, err, fmt.Sprintf("AfterCompleted: jetflow: invalid conflict policy: AfterEnded(%d)", bad))
		err = ValidatePolicy(jetflowtype.ConflictPolicy{AfterFailed: bad})
		require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy)
		require.EqualError(t, err, fmt.Sprintf("AfterFailed: jetflow: invalid conflict policy: AfterEnded(%d)", bad))
	}
	require.NoError(t, ValidateFingerprintMode(jetflowtype.FingerprintStrict))
	require.NoError(t, ValidateFingerprintMode(jetflowtype.FingerprintIgnore))
	for _, bad := range []jetflowtype.FingerprintMode{-1, 2, 99} {
		err := ValidateFingerprintMode(bad)
		require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy)
		require.EqualError(t, err, fmt.Sprintf("jetflow: invalid conflict policy: FingerprintMode(%d)", bad))
	}
}

// The envelope spells every valid policy and parses it back; an invalid
// policy is an error, not a panic.
func TestEnvelopePolicyRoundTrip(t *testing.T) {
	t.Parallel()
	p := jetflowtype.ConflictPolicy{WhileRunning: jetflowtype.RejectWhileRunning, AfterCompleted: jetflowtype.StartNew, AfterFailed: jetflowtype.RejectAfterEnd}
	env, err := EnvelopeFromPolicy(p)
	require.NoError(t, err)
	require.Equal(t, EnvelopePolicy{WhileRunning: "reject", AfterCompleted: "start_new", AfterFailed: "reject"}, env)
	back, err := env.Policy(jetflowtype.ConflictPolicy{})
	require.NoError(t, err)
	require.Equal(t, p, back)
	env, err = EnvelopeFromPolicy(jetflowtype.ConflictPolicy{WhileRunning: jetflowtype.Supersede})
	require.NoError(t, err)
	require.Equal(t, EnvelopePolicy{WhileRunning: "supersede", AfterCompleted: "return", AfterFailed: "return"}, env)

	for field, bad := range map[string]jetflowtype.ConflictPolicy{
		"WhileRunning":   {WhileRunning: 5},
		"AfterCompleted": {AfterCompleted: 5},
		"AfterFailed":    {AfterFailed: -1},
	} {
		_, err := EnvelopeFromPolicy(bad)
		require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy, field)
		require.ErrorContains(t, err, field)
	}
	_, err = EnvelopePolicy{AfterFailed: "restart"}.Policy(jetflowtype.ConflictPolicy{})
	require.ErrorIs(t, err, jetflowtype.ErrInvalidConflictPolicy)
}
