package state

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateRunID(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"stripe-evt_123", "order-42", "a", "b64==", strings.Repeat("x", MaxRunIDLen)} {
		require.NoError(t, ValidateRunID(ok), ok)
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "a*", "a>", "é", strings.Repeat("x", MaxRunIDLen+1)} {
		err := ValidateRunID(bad)
		require.ErrorIs(t, err, ErrInvalidRunID, bad)
	}
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	require.NoError(t, ValidateName("send-confirmation_2"))
	for _, bad := range []string{"", "a.b", "a=b", "x y", strings.Repeat("n", MaxNameLen+1)} {
		require.ErrorIs(t, ValidateName(bad), ErrInvalidName, bad)
	}
}

func TestStepIDIsAPureFunctionOfRunNameOccurrence(t *testing.T) {
	t.Parallel()
	require.Equal(t, "order-42.charge.0", StepID("order-42", "charge", 0))
	require.Equal(t, "order-42.charge.1", StepID("order-42", "charge", 1))
	require.NotEqual(t, StepID("r", "a", 1), StepID("r", "a", 0))
}

func TestDecodeRejectsMalformedRecords(t *testing.T) {
	t.Parallel()
	for _, b := range []string{``, `{`, `[]`, `{"run_id":"a b","workflow":"w","status":"running"}`,
		`{"run_id":"r","workflow":"w","status":"sleeping"}`, `{"run_id":"r","workflow":"","status":"running"}`} {
		_, err := DecodeRun([]byte(b))
		require.ErrorIs(t, err, ErrCorrupt, b)
	}
	for _, b := range []string{`{}`, `{"run_id":"r","workflow":"w","input":1}`, `{"run_id":"r","workflow":"w","token":"t","input":{`} {
		_, err := DecodeTask([]byte(b))
		require.ErrorIs(t, err, ErrCorrupt, b)
	}
	_, err := DecodeStep([]byte(`{"step_id":"x"}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeAudit([]byte(`{"duplicates":-1}`))
	require.ErrorIs(t, err, ErrCorrupt)

	run, err := DecodeRun([]byte(`{"v":1,"run_id":"r","workflow":"w","status":"completed","input":1}`))
	require.NoError(t, err)
	require.True(t, run.Status.Terminal())
}
