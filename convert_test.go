package jetflow

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// The public API has types of its own; these tests pin their conversions
// to and from the internal ones: every enum value both ways, an unknown
// value an error (never a default), every struct field carried.

// sameFields fails when pub and in do not have the same field names, so
// that a field added on one side only is noticed here.
func sameFields(t *testing.T, pub, in any) {
	t.Helper()
	names := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			out = append(out, rt.Field(i).Name)
		}
		return out
	}
	require.ElementsMatch(t, names(in), names(pub), "%T and %T", pub, in)
}

func TestNamesStructConversionsCarryEveryField(t *testing.T) {
	t.Parallel()
	info := workflow.StepInfo{StepID: "r.s.0", StepName: "s", Attempt: 2, RunID: "r", Workflow: "w"}
	sameFields(t, StepDetails{}, info)
	require.Equal(t, StepDetails{StepID: "r.s.0", StepName: "s", Attempt: 2, RunID: "r", Workflow: "w"}, stepDetailsFrom(info))

	ise := &workflow.StepError{RunID: "r", StepID: "r.s.0", StepName: "s", Attempts: 3, Fatal: true, Code: "card_declined", Message: "declined"}
	sameFields(t, StepError{}, *ise)
	se := stepErrorFrom(ise)
	require.Equal(t, &StepError{RunID: "r", StepID: "r.s.0", StepName: "s", Attempts: 3, Fatal: true, Code: "card_declined", Message: "declined"}, se)
	require.Equal(t, ise, se.toInternal())
	require.Equal(t, ise.Error(), se.Error(), "the text a run stores is unchanged")

	ice := &dedupe.ConflictError{RunID: "r", Field: "input", Stored: "ab", Requested: "cd"}
	sameFields(t, ConflictError{}, *ice)
	ce := conflictErrorFrom(ice)
	require.Equal(t, &ConflictError{RunID: "r", Field: "input", Stored: "ab", Requested: "cd"}, ce)
	require.Equal(t, ice.Error(), ce.Error())

	ire := &dedupe.RejectedError{RunID: "r", Status: state.StatusCompleted}
	sameFields(t, RejectedError{}, *ire)
	re := rejectedErrorFrom(ire)
	require.Equal(t, &RejectedError{RunID: "r", Status: StatusCompleted}, re)
	require.True(t, re.Status == StatusCompleted, "Status is the public RunStatus")
	require.Equal(t, ire.Error(), re.Error())

	info2 := state.ErrorInfo{Message: "m", Kind: "step", Fatal: true, Code: "c"}
	require.Equal(t, &RunError{RunID: "r", Status: StatusFailed, Kind: "step", Code: "c", Message: "m"}, runErrorFrom("r", StatusFailed, &info2))
}

func TestConflictAdmitErrorsBecomePublic(t *testing.T) {
	t.Parallel()
	var ce *ConflictError
	err := admitError(&dedupe.ConflictError{RunID: "r", Field: "workflow", Stored: "a", Requested: "b"})
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "workflow", ce.Field)
	require.ErrorIs(t, err, ErrIdempotencyConflict)

	var re *RejectedError
	err = admitError(&dedupe.RejectedError{RunID: "r", Status: state.StatusRunning})
	require.ErrorAs(t, err, &re)
	require.Equal(t, StatusRunning, re.Status)
	require.ErrorIs(t, err, ErrDuplicateRejected)

	other := errors.New("other")
	require.Same(t, other, admitError(other))
	require.NoError(t, admitError(nil))
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
	require.ErrorAs(t, wrapped, &ise, "StepError.As hands the engine its own form")
	require.Equal(t, se.toInternal(), ise)
	var pub *StepError
	require.ErrorAs(t, wrapped, &pub)
	require.Same(t, se, pub)
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

// TestNamesDeprecatedWrappersDoWhatTheNewNamesDo: the old names kept for
// one release are the new ones.
func TestNamesDeprecatedWrappersDoWhatTheNewNamesDo(t *testing.T) {
	t.Parallel()
	var old, cur stepOptions
	WithIdempotencyKey("k", time.Minute)(&old)
	WithTaskKey("k", time.Minute)(&cur)
	require.Equal(t, cur, old)
	_, ok := StepDetailsFrom(t.Context())
	require.False(t, ok, "outside a step")
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
