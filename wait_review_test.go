package jetflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// TestHookTokenAfterRestart: a run started again under the same run ID
// (StartNew) takes over the hook token its failed first generation
// registered, and a Resume of the token reaches the new generation.
func TestHookTokenAfterRestart(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rv-hook", func(ctx *Context, order string) (string, error) {
		a, err := WaitEvent[carrierUpdate](ctx, "approval", WithHookToken(order+"-approval"), WithTimeout(time.Second))
		if err != nil {
			return "", fmt.Errorf("taken=%v timeout=%v: %w", errors.Is(err, ErrHookTaken), errors.Is(err, ErrEventTimeout), err)
		}
		return a.Status, nil
	}, WithEvent[carrierUpdate]("approval"))
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	ctx := ctxT(t, 40*time.Second)
	h, err := Start(ctx, c, wf, "o1", WithRunID("rvh-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.ErrorContains(t, err, "timeout=true") // gen 0 timed out: failed

	h2, err := Start(ctx, c, wf, "o1", WithRunID("rvh-1"), WithConflictPolicy(ConflictPolicy{AfterFailed: StartNew}))
	require.NoError(t, err)
	// gen 1 waits on the same token; the operator resumes it.
	// Until generation 1 reaches its wait, the token is not found.
	require.Eventually(t, func() bool {
		_, err := c.Resume(ctx, "o1-approval", "e1", json.RawMessage(`{"status":"ok"}`))
		require.True(t, err == nil || errors.Is(err, ErrHookNotFound), "resume: %v", err)
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	got, err := h2.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "ok", got)
}

// TestAwaitFirstReportsEventTimeout: a wait's timeout matches
// ErrEventTimeout from AwaitFirst as from Get.
func TestAwaitFirstReportsEventTimeout(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rv-first", func(ctx *Context, _ int) (string, error) {
		ev := OnEvent[string](ctx, "ping", WithTimeout(time.Second))
		tm := Timer(ctx, "long", time.Minute)
		i, err := AwaitFirst(ctx, ev, tm)
		_, gerr := ev.Get(ctx)
		return fmt.Sprintf("won=%d awaitFirstIs=%v getIs=%v", i, errors.Is(err, ErrEventTimeout), errors.Is(gerr, ErrEventTimeout)), nil
	}, WithEvent[string]("ping"))
	env.worker(WorkerConfig{Concurrency: 4}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("rvf-1"))
	require.NoError(t, err)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, "won=0 awaitFirstIs=true getIs=true", got)
}

// TestSleepUntilOutOfRange: SleepUntil a time that cannot be stored (past
// year 9999) is an invalid call the body gets at once, not a wait whose
// task is released for ever.
func TestSleepUntilOutOfRange(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("rv-far", func(ctx *Context, _ int) (string, error) {
		err := SleepUntil(ctx, "far", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))
		return fmt.Sprint(err), nil
	})
	env.worker(WorkerConfig{Concurrency: 2}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("rvfar-1"))
	require.NoError(t, err)
	wctx := ctxT(t, 6*time.Second)
	got, err := h.Result(wctx)
	require.NoError(t, err, "the body must get an error (ErrInvalidInput), not loop")
	t.Log(got)
}

// TestRecheckOfEndedRunStoresNoTimer: a wait the body abandoned (it lost an
// AwaitFirst) leaves its recheck timer behind when the run completes; when
// that timer fires, the ended run stores no new one (and takes no token).
func TestRecheckOfEndedRunStoresNoTimer(t *testing.T) {
	t.Parallel()
	const window = 300 * time.Millisecond
	env := newEnv(t, Topology{DuplicateWindow: window})
	wf := NewWorkflow("rv-recheck", func(ctx *Context, _ int) (int, error) {
		ev := OnEvent[string](ctx, "ping")
		tm := Timer(ctx, "t", time.Second)
		return AwaitFirst(ctx, ev, tm)
	}, WithEvent[string]("ping"))
	env.worker(WorkerConfig{Concurrency: 2}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, wf, 0, WithRunID("rvr-1"))
	require.NoError(t, err)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, got)

	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	st, err := js.Stream(ctx, "JETFLOW_TIMERS")
	require.NoError(t, err)
	timerSubj := jetstream.RunTimer("rv-recheck", "rvr-1.event=ping.0").String()
	m, err := st.GetLastMsgForSubject(ctx, timerSubj)
	require.NoError(t, err, "a recheck timer is left for the completed run")
	// A day passes: past the duplicate window, so that a new recheck
	// would not be absorbed as a duplicate of the first.
	time.Sleep(3 * window)
	// The recheck fires: move it into the task stream as the forwarder would.
	require.NoError(t, st.DeleteMsg(ctx, m.Sequence))
	_, err = js.Publish(ctx, jetstream.RunSubject("rv-recheck", "rvr-1"), m.Data, natsjs.WithMsgID("rv-fired"))
	require.NoError(t, err)
	require.Never(t, func() bool {
		m2, err := st.GetLastMsgForSubject(ctx, timerSubj)
		return err == nil && m2.Sequence != m.Sequence
	}, 5*time.Second, 50*time.Millisecond, "the completed run was replayed and re-armed its recheck timer")
}
