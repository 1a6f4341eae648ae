package jetflow

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/startproto"
)

// G12: bad starts get a clear, typed error before anything is stored, and a
// run that exists is not changed by them.
func TestBadStartsAreRejectedAndStoredRunsKept(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("sum", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	// A good run to protect.
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 5, WithRunID("keep-1"))
	require.NoError(t, err)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	before, err := c.GetRun(ctxT(t, 5*time.Second), "keep-1")
	require.NoError(t, err)

	ctx := ctxT(t, 20*time.Second)
	cases := []struct {
		name  string
		start func() error
		want  error
	}{
		{"unknown workflow", func() error {
			_, err := c.StartByName(ctx, "no-such-workflow", json.RawMessage(`1`), WithRunID("keep-1"))
			return err
		}, ErrUnknownWorkflow},
		{"undecodable input", func() error {
			_, err := c.StartByName(ctx, "sum", json.RawMessage(`"five"`), WithRunID("keep-1"))
			return err
		}, ErrInvalidInput},
		{"undecodable input, new run ID", func() error {
			_, err := c.StartByName(ctx, "sum", json.RawMessage(`{"a":1}`), WithRunID("never-stored"))
			return err
		}, ErrInvalidInput},
		{"malformed JSON input", func() error {
			_, err := c.StartByName(ctx, "sum", json.RawMessage(`{"a":`), WithRunID("keep-1"))
			return err
		}, ErrInvalidInput},
		{"invalid run ID (SDK)", func() error {
			_, err := Start(ctx, c, wf, 1, WithRunID("bad id!"))
			return err
		}, ErrInvalidRunID},
		{"invalid run ID (by name)", func() error {
			_, err := c.StartByName(ctx, "sum", json.RawMessage(`1`), WithRunID(strings.Repeat("x", 129)))
			return err
		}, ErrInvalidRunID},
		{"invalid workflow name", func() error {
			_, err := c.StartByName(ctx, "sum.>", json.RawMessage(`1`))
			return err
		}, ErrInvalidName},
		{"input too large", func() error {
			_, err := c.StartByName(ctx, "sum", json.RawMessage(`"`+strings.Repeat("x", 600*1024)+`"`), WithRunID("keep-1"))
			return err
		}, ErrInputTooLarge},
	}
	for _, tc := range cases {
		err := tc.start()
		require.ErrorIs(t, err, tc.want, tc.name)
	}

	// A malformed envelope from a client that does not use the SDK.
	nc := env.conn()
	for _, body := range []string{`not json`, `{"run_id": 7}`, `{"run_id":"a b","input":1}`, ``} {
		msg, err := nc.Request(startproto.AdmitSubjectPrefix+"sum", []byte(body), 5*time.Second)
		require.NoError(t, err)
		var reply startproto.StartReply
		require.NoError(t, json.Unmarshal(msg.Data, &reply), body)
		require.NotNil(t, reply.Error, "envelope %q accepted", body)
		require.Contains(t, []string{startproto.CodeMalformed, startproto.CodeInvalidRunID}, reply.Error.Code)
	}

	// A duplicate with a different, valid input is a conflict (strict
	// fingerprint, the default) or absorbed (ignore mode); either way the
	// stored input is kept.
	_, err = c.StartByName(ctx, "sum", json.RawMessage(`99`), WithRunID("keep-1"))
	require.ErrorIs(t, err, ErrIdempotencyConflict)
	res, err := c.StartByName(ctx, "sum", json.RawMessage(`99`), WithRunID("keep-1"), WithFingerprintMode(FingerprintIgnore))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, res.Outcome)

	_, err = c.GetRun(ctx, "never-stored")
	require.ErrorIs(t, err, ErrRunNotFound)
	after, err := c.GetRun(ctx, "keep-1")
	require.NoError(t, err)
	require.Equal(t, before.Status, after.Status)
	require.JSONEq(t, string(before.Input), string(after.Input))
	require.JSONEq(t, string(before.Output), string(after.Output))
	require.Equal(t, before.UpdatedAt, after.UpdatedAt)
	require.Equal(t, 3, len(effects.snapshot()))
}

// G12: a malformed task message on the stream (someone publishing by hand)
// is terminated and logged; the worker goes on serving other runs.
func TestMalformedTaskDoesNotStopTheWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("sum", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	for i, body := range []string{`garbage`, `{"v":1,"run_id":"x y","workflow":"sum"}`, `{"v":1,"run_id":"ok","workflow":"sum","input":1}`} {
		_, err := jetstream.PublishTask(ctxT(t, 5*time.Second), c.assets.JS, jetstream.RunSubject("sum", "junk-"+string(rune('a'+i))), "junk-"+string(rune('a'+i)), []byte(body))
		require.NoError(t, err)
	}
	h, err := Start(ctxT(t, 10*time.Second), c, wf, 1, WithRunID("after-junk"))
	require.NoError(t, err)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, 4, out)
	waitTasksDrained(t, c)
	_, err = c.GetRun(ctxT(t, 5*time.Second), "ok")
	require.ErrorIs(t, err, ErrRunNotFound, "a task without a token must not create a run")
}
