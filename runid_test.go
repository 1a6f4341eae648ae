package jetflow

import (
	"encoding/json"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// An empty or absent run ID is never replaced by a generated one (G1): from
// Go, WithRunID("") is ErrInvalidRunID and no run ID option at all is
// ErrRunIDRequired; a generated ID is asked for with WithGeneratedRunID and
// gives a new run each time. Nothing is stored by a refused start.
func TestEmptyRunIDIsRefusedFromGo(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := threeSteps("rid-go", newCounter())
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	for i := 0; i < 2; i++ { // a retried script whose ID variable is unset
		_, err := Start(ctx, c, wf, 1, WithRunID(""))
		require.ErrorIs(t, err, ErrInvalidRunID)
		_, err = c.StartByName(ctx, "rid-go", json.RawMessage(`1`), WithRunID(""))
		require.ErrorIs(t, err, ErrInvalidRunID)
		_, err = Start(ctx, c, wf, 1)
		require.ErrorIs(t, err, ErrRunIDRequired)
		_, err = c.StartByName(ctx, "rid-go", json.RawMessage(`1`))
		require.ErrorIs(t, err, ErrRunIDRequired)
	}
	_, err := Start(ctx, c, wf, 1, WithRunID("x"), WithGeneratedRunID())
	require.ErrorIs(t, err, ErrInvalidRunID, "both options")
	page, err := c.ListRuns(ctx, ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs, "a refused start stores nothing")

	// Asked for explicitly, a generated ID makes a new run each time.
	h1, err := Start(ctx, c, wf, 1, WithGeneratedRunID())
	require.NoError(t, err)
	h2, err := Start(ctx, c, wf, 1, WithGeneratedRunID())
	require.NoError(t, err)
	r3, err := c.StartByName(ctx, "rid-go", json.RawMessage(`1`), WithGeneratedRunID())
	require.NoError(t, err)
	for _, id := range []string{h1.RunID, h2.RunID, r3.RunID} {
		require.NoError(t, state.ValidateRunID(id))
	}
	require.Equal(t, OutcomeCreated, h2.Outcome)
	require.Equal(t, OutcomeCreated, r3.Outcome)
	require.Len(t, map[string]bool{h1.RunID: true, h2.RunID: true, r3.RunID: true}, 3)
}

// Over NATS request-reply: "run_id": "" and null are invalid_run_id, an
// envelope without run_id is run_id_required, and "generate_run_id": true
// (alone) is the way to a generated ID.
func TestEmptyRunIDIsRefusedOverRequestReply(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	env.worker(WorkerConfig{}, threeSteps("rid-rr", newCounter()))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	for _, c := range []struct{ envelope, code string }{
		{`{"run_id":"","input":1}`, "invalid_run_id"},
		{`{"run_id":null,"input":1}`, "invalid_run_id"},
		{`{"run_id":"","input":1}`, "invalid_run_id"}, // the retry
		{`{"input":1}`, "run_id_required"},
		{`{}`, "run_id_required"},
		{`{"run_id":"rid-1","generate_run_id":true,"input":1}`, "malformed_request"},
		{`{"run_id":"","generate_run_id":true,"input":1}`, "malformed_request"},
		{`{"generate_run_id":false,"input":1}`, "run_id_required"},
	} {
		reply := request(t, nc, "rid-rr", c.envelope)
		require.Equal(t, c.code, errorCode(reply), "%s: %v", c.envelope, reply)
		require.Nil(t, reply["outcome"], c.envelope)
	}
	kv, err := js.KeyValue(ctxT(t, 5*time.Second), "jetflow_runs")
	require.NoError(t, err)
	_, err = kv.Keys(ctxT(t, 5*time.Second))
	require.ErrorIs(t, err, natsjs.ErrNoKeysFound, "a refused start stored a run")

	a := request(t, nc, "rid-rr", `{"generate_run_id":true,"input":1}`)
	b := request(t, nc, "rid-rr", `{"generate_run_id":true,"input":1}`)
	require.Equal(t, "created", a["outcome"], a)
	require.Equal(t, "created", b["outcome"], b)
	require.NotEmpty(t, a["run_id"])
	require.NotEqual(t, a["run_id"], b["run_id"])
}

// A workflow with RequireRunID refuses even an explicit request for a
// generated ID, from Go and over NATS.
func TestRequireRunIDRefusesGeneratedIDs(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rid-keyed", func(ctx *Context, in int) (int, error) { return in, nil }, RequireRunID())
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	_, err := Start(ctx, c, wf, 1, WithGeneratedRunID())
	require.ErrorIs(t, err, ErrRunIDRequired)
	_, err = c.StartByName(ctx, "rid-keyed", json.RawMessage(`1`), WithGeneratedRunID())
	require.ErrorIs(t, err, ErrRunIDRequired)
	reply := request(t, env.conn(), "rid-keyed", `{"generate_run_id":true,"input":1}`)
	require.Equal(t, "run_id_required", errorCode(reply), reply)
	page, err := c.ListRuns(ctx, ListOptions{})
	require.NoError(t, err)
	require.Empty(t, page.Runs)
}

// On the durable subject a run_id that is "" or null is refused even with a
// Nats-Msg-Id (the header stands in for an absent run_id only), and
// generate_run_id is refused (a redelivery would start another run): each
// envelope is terminated with invalid_run_id and starts nothing.
func TestEmptyRunIDIsRefusedOnTheDurableSubject(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	logs := &testenv.LogBuffer{}
	env.worker(WorkerConfig{Logger: zerolog.New(logs).Level(zerolog.WarnLevel)}, threeSteps("rid-dur", newCounter()))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	bad := []struct{ msgID, envelope string }{
		{"dur-1", `{"run_id":"","input":1}`},
		{"dur-2", `{"run_id":null,"input":1}`},
		{"", `{"run_id":"","input":1}`},
		{"", `{"generate_run_id":true,"input":1}`},
		{"dur-3", `{"generate_run_id":true,"input":1}`},
	}
	for _, b := range bad {
		publishStart(t, js, "rid-dur", b.msgID, b.envelope)
	}
	startsSettled(t, js, "rid-dur")
	var terminated []map[string]any
	require.Eventually(t, func() bool {
		terminated = levelLines(t, logs, "error", "")
		return len(terminated) >= len(bad)
	}, 10*time.Second, 20*time.Millisecond)
	for _, line := range terminated {
		require.Equal(t, "invalid_run_id", line["code"], line)
	}
	kv, err := js.KeyValue(ctxT(t, 5*time.Second), "jetflow_runs")
	require.NoError(t, err)
	_, err = kv.Keys(ctxT(t, 5*time.Second))
	require.ErrorIs(t, err, natsjs.ErrNoKeysFound, "a refused durable start stored a run")

	// The header still names the run when run_id is left out.
	publishStart(t, js, "rid-dur", "dur-ok", `{"input":1}`)
	waitRunStatus(t, js, "dur-ok", "completed")
}
