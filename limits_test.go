package jetflow

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
)

// measureWorkflow returns the length of its string input from two steps, so
// that the input travels in the start task, in a step task and in the run
// record.
func measureWorkflow(name string) *Workflow[string, int] {
	return NewWorkflow(name, func(ctx *Context, in string) (int, error) {
		n, err := Step(ctx, "measure", func(context.Context) (int, error) { return len(in), nil })
		if err != nil {
			return 0, err
		}
		return Step(ctx, "confirm", func(context.Context) (int, error) { return n, nil })
	})
}

// G12, limits: an input of exactly state.MaxInputBytes (as JSON) still fits
// in every task message and record of its run, through the SDK, by name and
// over plain NATS with characters that HTML-escaping would have grown
// six-fold; one byte more is ErrInputTooLarge and stores nothing.
func TestInputAtTheLimitRunsAndOverItIsRefused(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := measureWorkflow("measure")
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	const atLimit = state.MaxInputBytes - 2 // characters of a JSON string of MaxInputBytes
	longID := strings.Repeat("L", state.MaxRunIDLen)

	// Through the SDK, with the longest run ID.
	in := strings.Repeat("x", atLimit)
	raw, err := json.Marshal(in)
	require.NoError(t, err)
	require.Len(t, raw, state.MaxInputBytes)
	h, err := Start(ctxT(t, 10*time.Second), c, wf, in, WithRunID(longID))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	out, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, atLimit, out)

	// By name.
	res, err := c.StartByName(ctxT(t, 10*time.Second), wf.Name(), raw, WithRunID("by-name-at-limit"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, res.Outcome)
	run, err := c.WaitRun(ctxT(t, 30*time.Second), "by-name-at-limit")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `524286`, string(run.Output))

	// Over plain NATS, as a client in another language sends it: the input
	// is not escaped, and must not be escaped on its way into the task.
	nc := env.conn()
	lt := `"` + strings.Repeat("<", atLimit) + `"`
	body := `{"run_id":"raw-at-limit","input":` + lt + `}`
	msg, err := nc.Request(startproto.AdmitSubjectPrefix+wf.Name(), []byte(body), 10*time.Second)
	require.NoError(t, err)
	var reply startproto.StartReply
	require.NoError(t, json.Unmarshal(msg.Data, &reply))
	require.Nil(t, reply.Error, "reply %+v", reply.Error)
	require.Equal(t, "created", reply.Outcome)
	run, err = c.WaitRun(ctxT(t, 30*time.Second), "raw-at-limit")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `524286`, string(run.Output))
	require.Len(t, run.Input, state.MaxInputBytes, "the stored input is the one sent")

	// Nothing else is running now: over-limit starts must not publish a
	// task or write a record.
	ctx := ctxT(t, 20*time.Second)
	waitTasksDrained(t, c)
	info, err := c.assets.Tasks.Info(ctx)
	require.NoError(t, err)
	lastSeq := info.State.LastSeq

	over := strings.Repeat("x", atLimit+1)
	_, err = Start(ctx, c, wf, over, WithRunID("over-sdk"))
	require.ErrorIs(t, err, ErrInputTooLarge)
	overRaw, err := json.Marshal(over)
	require.NoError(t, err)
	_, err = c.StartByName(ctx, wf.Name(), overRaw, WithRunID("over-by-name"))
	require.ErrorIs(t, err, ErrInputTooLarge)
	msg, err = nc.Request(startproto.AdmitSubjectPrefix+wf.Name(), []byte(`{"run_id":"over-raw","input":"`+strings.Repeat("<", atLimit+1)+`"}`), 10*time.Second)
	require.NoError(t, err)
	reply = startproto.StartReply{}
	require.NoError(t, json.Unmarshal(msg.Data, &reply))
	require.NotNil(t, reply.Error)
	require.Equal(t, startproto.CodeTooLarge, reply.Error.Code)
	// An input at the limit with a source so long that the start task would
	// not fit in a NATS message.
	_, err = Start(ctx, c, wf, in, WithRunID("over-source"), WithSource(strings.Repeat("s", 600*1024)))
	require.ErrorIs(t, err, ErrInputTooLarge)

	for _, id := range []string{"over-sdk", "over-by-name", "over-raw", "over-source"} {
		_, err := c.GetRun(ctx, id)
		require.ErrorIs(t, err, ErrRunNotFound, id)
	}
	info, err = c.assets.Tasks.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, lastSeq, info.State.LastSeq, "an over-limit start published a task")
}
