package dedupe

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
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

// The duplicate start's decision table, row by row, and the order of rows
// that overlap.
func TestDuplicateDecisionTable(t *testing.T) {
	t.Parallel()
	running := state.Run{Workflow: "w", Status: state.StatusRunning}
	completed := state.Run{Workflow: "w", Status: state.StatusCompleted}
	superseded := state.Run{Workflow: "w", Status: state.StatusCancelled, Error: &state.ErrorInfo{Code: jetflowtype.CodeSuperseded}}
	supersede := jetflowtype.ConflictPolicy{WhileRunning: jetflowtype.Supersede}
	startNew := jetflowtype.ConflictPolicy{AfterCompleted: jetflowtype.StartNew}
	reject := jetflowtype.ConflictPolicy{WhileRunning: jetflowtype.RejectWhileRunning}
	req := func(p jetflowtype.ConflictPolicy) Request { return Request{Workflow: "w", Policy: p} }
	for _, tc := range []struct {
		name       string
		req        Request
		run        state.Run
		match      bool
		round      int
		restartOwn bool
		want       dupDecision
	}{
		{"1: another workflow, whatever the policy", Request{Workflow: "v", Policy: supersede}, running, false, 0, false, dupOtherWorkflow},
		{"2: superseding, out of rounds", req(supersede), running, false, maxSupersedeRounds, false, dupOutraced},
		{"2: superseded run to start anew, out of rounds", req(supersede), superseded, true, maxSupersedeRounds, false, dupOutraced},
		{"2 not when restarting its own cancel", req(supersede), superseded, true, maxSupersedeRounds, true, dupRestart},
		{"3: supersede other input", req(supersede), running, false, 0, false, dupSupersede},
		{"4: start new after completion", req(startNew), completed, true, 0, false, dupRestart},
		{"4: start new with other input (no conflict then)", req(startNew), completed, false, 0, false, dupRestart},
		{"4: restart of a superseded generation", req(supersede), superseded, true, 1, false, dupRestart},
		{"4 out of rounds: the newest run is the answer", req(startNew), completed, true, maxRestartRounds, false, dupAttach},
		{"5: supersede with the same input attaches", req(supersede), running, true, 0, false, dupAttach},
		{"6: other input", req(jetflowtype.ConflictPolicy{}), running, false, 0, false, dupOtherInput},
		{"6 before 7: other input is a conflict, not a rejection", req(reject), running, false, 0, false, dupOtherInput},
		{"6 not with fingerprints ignored", Request{Workflow: "w", IgnoreInput: true}, running, false, 0, false, dupAttach},
		{"7: reject while running", req(reject), running, true, 0, false, dupReject},
		{"8: attach while running", req(jetflowtype.ConflictPolicy{}), running, true, 0, false, dupAttach},
		{"8: return once completed", req(jetflowtype.ConflictPolicy{}), completed, true, 0, false, dupAttach},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, duplicateDecision(tc.req, tc.run, tc.match, tc.round, tc.restartOwn))
		})
	}
}
