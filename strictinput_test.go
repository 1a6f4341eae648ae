package jetflow

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

type signup struct {
	Email   string  `json:"email"`
	Plan    string  `json:"plan"`
	Address address `json:"address"`
}

type address struct {
	Country string `json:"country"`
}

// WithStrictInput refuses, at admission, a start whose input has a field
// the input type does not declare (top level or nested), with
// ErrInvalidInput, whichever way the start comes: StartByName with raw
// JSON, a request-reply envelope (invalid_input), the durable start
// stream (terminated). Nothing is stored. A workflow without the option
// takes the same input and drops the field, as before; a declared input
// passes both.
func TestStrictInputRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	logs := &testenv.LogBuffer{}
	body := func(ctx *Context, in signup) (string, error) { return in.Plan + "/" + in.Address.Country, nil }
	env.worker(WorkerConfig{Logger: zerolog.New(logs).Level(zerolog.WarnLevel)},
		NewWorkflow("signup-strict", body, WithStrictInput()), NewWorkflow("signup-loose", body))
	c := env.client()
	nc := env.conn()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t, 30*time.Second)

	const declared = `{"email":"ada@example.com","plan":"pro","address":{"country":"fr"}}`
	for i, in := range []string{
		`{"email":"ada@example.com","plna":"pro"}`,                   // misspelt at the top
		`{"email":"ada@example.com","address":{"contry":"fr"}}`,      // nested
		`{"email":"ada@example.com","plan":"pro","coupon":"SAVE10"}`, // extra
	} {
		_, err := c.StartByName(ctx, "signup-strict", json.RawMessage(in), WithRunID("strict-1"))
		require.ErrorIs(t, err, ErrInvalidInput, in)
		require.ErrorContains(t, err, "unknown field", in)

		reply := request(t, nc, "signup-strict", `{"run_id":"strict-1","input":`+in+`}`)
		require.Equal(t, "invalid_input", errorCode(reply), "%s: %v", in, reply)

		res, err := c.StartByName(ctx, "signup-loose", json.RawMessage(in), WithRunID(fmt.Sprintf("loose-%d", i)))
		require.NoError(t, err, "without the option the field is dropped: %s", in)
		require.Equal(t, OutcomeCreated, res.Outcome)
	}
	_, err = c.GetRun(ctx, "strict-1")
	require.ErrorIs(t, err, ErrRunNotFound, "a refused start stored nothing")

	// The durable start stream: the envelope is terminated, its reason
	// logged; a declared input is admitted and runs.
	publishStart(t, js, "signup-strict", "strict-2", `{"run_id":"strict-2","input":{"email":"a@b.c","plna":"pro"}}`)
	publishStart(t, js, "signup-strict", "strict-3", `{"run_id":"strict-3","input":`+declared+`}`)
	startsSettled(t, js, "signup-strict")
	run, err := c.WaitRun(ctx, "strict-3")
	require.NoError(t, err)
	require.JSONEq(t, `"pro/fr"`, string(run.Output))
	_, err = c.GetRun(ctx, "strict-2")
	require.ErrorIs(t, err, ErrRunNotFound)
	var refused []map[string]any
	require.Eventually(t, func() bool {
		refused = levelLines(t, logs, "error", "")
		return len(refused) > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.Len(t, refused, 1)
	require.Equal(t, "invalid_input", refused[0]["code"])
	require.Contains(t, refused[0]["reason"], `unknown field "plna"`)

	// A declared input starts by name too.
	res, err := c.StartByName(ctx, "signup-strict", json.RawMessage(declared), WithRunID("strict-4"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, res.Outcome)
}
