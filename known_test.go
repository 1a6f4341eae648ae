package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// A start nobody answers is told apart by the deployment's record of the
// workflows it has served: a name no worker ever served is
// ErrUnknownWorkflow (a client error, not worth retrying); a known
// workflow whose workers are all gone is a *NoWorkerError, which matches
// ErrUnavailable (retry later). Neither stores anything.
func TestStartTellsUnknownWorkflowFromNoWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	wf := threeSteps("known-wf", newCounter())
	w := startWorker(t, env.conn(), WorkerConfig{Name: "first-worker"}, wf)
	res, err := c.StartByName(ctx, "known-wf", json.RawMessage(`1`), WithRunID("k-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, res.Outcome)
	_, err = c.WaitRun(ctx, "k-1")
	require.NoError(t, err)
	require.NoError(t, w.Stop(ctx))

	_, err = c.StartByName(ctx, "known-wf", json.RawMessage(`1`), WithRunID("k-2"))
	require.ErrorIs(t, err, ErrUnavailable, "known workflow, no worker: retry later")
	require.ErrorIs(t, err, ErrNoWorker)
	require.NotErrorIs(t, err, ErrUnknownWorkflow)
	var nw *NoWorkerError
	require.ErrorAs(t, err, &nw)
	require.Equal(t, "known-wf", nw.Workflow)
	require.Equal(t, "first-worker", nw.FirstWorker)
	require.Contains(t, err.Error(), `no worker is running for workflow "known-wf"`)

	_, err = c.StartByName(ctx, "knwon-wf", json.RawMessage(`1`), WithRunID("k-3"))
	require.ErrorIs(t, err, ErrUnknownWorkflow, "a typo")
	require.NotErrorIs(t, err, ErrUnavailable, "a typo is not worth retrying")
	require.NotErrorIs(t, err, ErrNoWorker)

	// The typed Start by request tells them apart the same way.
	pc, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)
	_, err = Start(ctx, pc, wf, 1, WithRunID("k-4"))
	require.ErrorIs(t, err, ErrNoWorker)
	_, err = Start(ctx, pc, threeSteps("never-served", newCounter()), 1, WithRunID("k-5"))
	require.ErrorIs(t, err, ErrUnknownWorkflow)

	for _, id := range []string{"k-2", "k-3", "k-4", "k-5"} {
		_, err := c.GetRun(ctx, id)
		require.ErrorIs(t, err, ErrRunNotFound, "%s: nothing stored", id)
	}
}

// When the record of known workflows cannot be read, a start nobody
// answered is ErrUnavailable: never "unknown workflow" by accident.
func TestUnreadableWorkflowRecordIsUnavailable(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(ctx, "KV_"+jetstream.WorkflowsBucket))

	_, err = c.StartByName(ctx, "order", json.RawMessage(`1`), WithRunID("u-1"))
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotErrorIs(t, err, ErrUnknownWorkflow)
	require.Contains(t, err.Error(), "whether it is known could not be read")
}

// A worker killed without Stop leaves its liveness record behind for at
// most its LivenessTTL: the server expires it, no process has to. Its
// workflow stays known: a start is then "no worker running", not
// "unknown".
func TestKilledWorkerLivenessExpires(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client() // provisions the bucket
	ctx := ctxT(t, 60*time.Second)
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, jetstream.WorkflowsBucket)
	require.NoError(t, err)
	watch, err := kv.Watch(ctx, "live.crashy.*")
	require.NoError(t, err)
	defer func() { require.NoError(t, watch.Stop()) }()
	next := func(deadline <-chan time.Time) natsjs.KeyValueEntry {
		t.Helper()
		for {
			select {
			case e := <-watch.Updates():
				if e != nil {
					return e
				}
			case <-deadline:
				t.Fatal("no liveness update before the deadline")
			}
		}
	}

	child := startChild(t, env, "", "")
	require.NoError(t, waitReady(child, 30*time.Second))
	// Heartbeats every third of the TTL: a put within a few TTLs.
	require.Equal(t, natsjs.KeyValuePut, next(time.After(10*childLivenessTTL)).Operation())
	require.NoError(t, child.Process.Kill())
	require.Error(t, child.Wait(), "killed")

	// The last heartbeat is at most one TTL old; the server expires a
	// message within about a second of its TTL. Ten TTLs is ample.
	deadline := time.After(10 * childLivenessTTL)
	for next(deadline).Operation() == natsjs.KeyValuePut {
	}
	keys, err := kv.ListKeysFiltered(ctx, "live.crashy.*")
	require.NoError(t, err)
	var live []string
	for k := range keys.Keys() {
		live = append(live, k)
	}
	require.Empty(t, live, "no liveness record outlives its TTL")

	_, err = c.StartByName(ctx, "crashy", json.RawMessage(`1`), WithRunID("after-kill"))
	require.ErrorIs(t, err, ErrNoWorker)
	require.True(t, errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrUnknownWorkflow))
}

// Stop withdraws the worker's liveness records at once; the workflow stays
// known.
func TestStopWithdrawsLiveness(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	w := startWorker(t, env.conn(), WorkerConfig{}, threeSteps("withdrawn", newCounter()))
	count := func() int {
		keys, err := c.assets.Workflows.Raw().ListKeysFiltered(ctx, "live.withdrawn.*")
		require.NoError(t, err)
		n := 0
		for range keys.Keys() {
			n++
		}
		return n
	}
	require.Equal(t, 1, count(), "a started worker is listed")
	require.NoError(t, w.Stop(ctx))
	require.Zero(t, count(), "a stopped one is not")
	_, found, err := lookupKnown(ctx, c, "withdrawn")
	require.NoError(t, err)
	require.True(t, found)
}

func TestLivenessTTLUnderASecondIsRefused(t *testing.T) {
	t.Parallel()
	ws := NewRegistry()
	require.NoError(t, ws.Register(threeSteps("x", newCounter())))
	_, err := NewWorker(newEnv(t, Topology{}).conn(), ws, WorkerConfig{LivenessTTL: 500 * time.Millisecond})
	require.ErrorContains(t, err, "LivenessTTL must be at least 1s")
}

// lookupKnown reads the known record of workflow through c's bucket.
func lookupKnown(ctx context.Context, c *Client, workflow string) (json.RawMessage, bool, error) {
	v, _, err := c.assets.Workflows.Get(ctx, "known."+workflow)
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil, false, nil
	}
	return v, err == nil, err
}
