package jetflow

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// The types the API shares with the engine are jetflowtype's, re-exported
// (no conversions). What is left to pin here: the run error built from a
// stored record, the error chains as a workflow and a caller see them, and
// the names that must equal the engine's.

func TestNamesRunErrorFromARecord(t *testing.T) {
	t.Parallel()
	info2 := state.ErrorInfo{Message: "m", Kind: "step", Fatal: true, Code: "c"}
	require.Equal(t, &RunError{RunID: "r", Status: StatusFailed, Kind: "step", Code: "c", Message: "m"}, runErrorFrom("r", StatusFailed, &info2))
}

// The admitter's refusals are the public errors themselves: errors.As
// reaches them and they match the public sentinels.
func TestConflictAdmitErrorsArePublic(t *testing.T) {
	t.Parallel()
	var err error = &dedupe.ConflictError{RunID: "r", Field: "workflow", Stored: "a", Requested: "b"}
	var ce *ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "workflow", ce.Field)
	require.ErrorIs(t, err, ErrIdempotencyConflict)

	err = &dedupe.RejectedError{RunID: "r", Status: state.StatusRunning}
	var re *RejectedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusRunning, re.Status)
	require.ErrorIs(t, err, ErrDuplicateRejected)
}

func TestCodeErrorChains(t *testing.T) {
	t.Parallel()
	base := errors.New("declined")
	for name, err := range map[string]error{
		"fatal outside": Fatal(ErrorWithCode("card_declined", base)),
		"fatal inside":  ErrorWithCode("card_declined", Fatal(base)),
	} {
		var coded *CodedError
		require.ErrorAs(t, err, &coded, name)
		require.Equal(t, "card_declined", coded.ErrorCode(), name)
		var fatal *FatalError
		require.ErrorAs(t, err, &fatal, name)
		require.ErrorIs(t, err, base, name)
	}
	retry := ErrorWithCode("rate_limited", RetryAfter(base, time.Second))
	var r *RetryableError
	require.ErrorAs(t, retry, &r)
	require.Equal(t, time.Second, r.RetryAfter())

	// A step failure, as the workflow gets it from a replay: the code is
	// reached through errors.As, and the engine still sees a step failure.
	se := &StepError{RunID: "r", StepID: "r.charge.0", StepName: "charge", Attempts: 1, Fatal: true, Code: "card_declined", Message: "fatal: card_declined: declined"}
	wrapped := fmt.Errorf("charging: %w", se)
	require.ErrorIs(t, wrapped, ErrStepFailed)
	var coded *CodedError
	require.ErrorAs(t, wrapped, &coded)
	require.Equal(t, "card_declined", coded.Code)
	require.Equal(t, "card_declined: "+se.Message, coded.Error())
	var ise *workflow.StepError
	require.ErrorAs(t, wrapped, &ise, "the engine's StepError is the public one")
	require.Same(t, se, ise)
	require.NoError(t, (&StepError{Message: "no code"}).Unwrap(), "no code, nothing to unwrap")

	runErr := &RunError{RunID: "r", Status: StatusFailed, Kind: "step", Code: "card_declined", Message: "m"}
	require.ErrorIs(t, runErr, ErrRunFailed)
	require.ErrorAs(t, runErr, &coded)
	require.Equal(t, "card_declined", coded.Code)
	require.NoError(t, (&RunError{Message: "no code"}).Unwrap())
}

func TestConflictPolicyInvalidDefaultRefusedByRegistry(t *testing.T) {
	t.Parallel()
	bad := NewWorkflow("bad-policy", func(*Context, int) (int, error) { return 0, nil },
		WithDefaultConflictPolicy(ConflictPolicy{AfterFailed: 9}))
	good := NewWorkflow("good", func(*Context, int) (int, error) { return 0, nil })
	r := NewRegistry()
	require.ErrorIs(t, r.Register(good, bad), ErrInvalidConflictPolicy)
	require.Empty(t, r.Names(), "a refused batch registers none")
	require.NoError(t, r.Register(good))
	require.Equal(t, []string{"good"}, r.Names())
}

// TestNamesConstantsEqualTheEngines: the public constants are written as
// literals (go doc shows their values) and must equal the engine's.
func TestNamesConstantsEqualTheEngines(t *testing.T) {
	t.Parallel()
	require.Equal(t, state.MaxTaskKeyLen, MaxTaskKeyLen)
	require.Equal(t, workflow.DefaultKeyLease, DefaultKeyLease)
	for pub, in := range map[RunStatus]state.Status{
		StatusRunning: state.StatusRunning, StatusCompleted: state.StatusCompleted,
		StatusFailed: state.StatusFailed, StatusCancelled: state.StatusCancelled,
	} {
		require.Equal(t, string(in), string(pub))
		require.Equal(t, in.Terminal(), pub.Terminal())
	}
}
