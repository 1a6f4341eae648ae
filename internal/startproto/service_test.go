package startproto

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/jetflowtype"
)

func TestDecodeStartRequest(t *testing.T) {
	t.Parallel()
	req, err := DecodeStartRequest("w", []byte(`{"generate_run_id":true,"input":{"a":1}}`), jetflowtype.ConflictPolicy{})
	require.NoError(t, err)
	require.NotEmpty(t, req.RunID, "a run ID is generated when asked for")
	_, err = DecodeStartRequest("w", []byte(`{"input":{"a":1}}`), jetflowtype.ConflictPolicy{})
	require.ErrorIs(t, err, ErrRunIDRequired, "never without asking")
	req, err = DecodeStartRequest("w", []byte(`{"run_id":"k-1"}`), jetflowtype.ConflictPolicy{})
	require.NoError(t, err)
	require.Equal(t, "k-1", req.RunID)
	require.JSONEq(t, `null`, string(req.Input))
	for _, bad := range []string{``, `[]`, `{"run_id":1}`, `{"run_id":"a.b"}`, `{"run_id":""}`, `{"run_id":null}`} {
		_, err := DecodeStartRequest("w", []byte(bad), jetflowtype.ConflictPolicy{})
		require.Error(t, err, bad)
	}
}
