package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// A start nobody answers is told apart by the deployment's record of the
// workflows it has served: while a worker of the deployment runs (here
// one serving another workflow), a name no worker ever served is
// ErrUnknownWorkflow (a client error, not worth retrying); a known
// workflow whose workers are all gone is a *NoWorkerError, which matches
// ErrUnavailable (retry later). Neither stores anything.
func TestStartTellsUnknownWorkflowFromNoWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	env.worker(WorkerConfig{Name: "bystander"}, threeSteps("other-wf", newCounter()))
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

// Kubernetes may start the producer before any worker: NATS, then the
// producer, then the workers. Until a worker of the deployment has
// reported, a start by name is a *NoWorkerError (ErrUnavailable: retry
// with the same run ID) whatever the name, since nothing tells a workflow
// whose workers are still starting from a typo yet. Once a worker serving
// it has started, the same start creates the run, once.
func TestStartBeforeAnyWorkerReportedIsRetryable(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client() // the producer, up first: it provisions the streams
	ctx := ctxT(t, 60*time.Second)
	effects := newCounter()
	wf := threeSteps("orders", effects)

	for _, name := range []string{"orders", "ordrs"} {
		_, err := c.StartByName(ctx, name, json.RawMessage(`1`), WithRunID("fresh-1"))
		require.ErrorIs(t, err, ErrUnavailable, "%s: no worker has reported yet: retry later", name)
		require.ErrorIs(t, err, ErrNoWorker)
		require.NotErrorIs(t, err, ErrUnknownWorkflow)
		var nw *NoWorkerError
		require.ErrorAs(t, err, &nw)
		require.Equal(t, name, nw.Workflow)
		require.Empty(t, nw.FirstWorker, "no worker ever served it")
		require.True(t, nw.FirstServed.IsZero())
		require.Contains(t, err.Error(), `no worker is running for workflow "`+name+`": no worker of this deployment has reported yet`)
	}
	pc, err := NewClient(ctx, env.conn(), ClientConfig{StartByRequest: true})
	require.NoError(t, err)
	_, err = Start(ctx, pc, wf, 1, WithRunID("fresh-1"))
	require.ErrorIs(t, err, ErrNoWorker, "the typed start by request says the same")
	_, err = c.GetRun(ctx, "fresh-1")
	require.ErrorIs(t, err, ErrRunNotFound, "nothing stored")

	env.worker(WorkerConfig{Name: "first"}, wf) // returns once it answers starts
	res, err := c.StartByName(ctx, "orders", json.RawMessage(`1`), WithRunID("fresh-1"))
	require.NoError(t, err, "the same start, retried once the worker is up")
	require.Equal(t, OutcomeCreated, res.Outcome)
	again, err := Start(ctx, pc, wf, 1, WithRunID("fresh-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, again.Outcome)
	run, err := c.WaitRun(ctx, "fresh-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `4`, string(run.Output))
	require.EqualValues(t, 1, run.Duplicates, "the starts before the worker stored nothing; the one after the creation found the run")
	require.Equal(t, map[string]int{"fresh-1.a.0": 1, "fresh-1.b.0": 1, "fresh-1.c.0": 1}, effects.snapshot(), "one run, each step once")

	// Now that a worker runs, a name none ever served is a typo.
	_, err = c.StartByName(ctx, "ordrs", json.RawMessage(`1`), WithRunID("fresh-2"))
	require.ErrorIs(t, err, ErrUnknownWorkflow)
	require.NotErrorIs(t, err, ErrUnavailable)
}

// With a worker of the deployment live, serving workflow A, a start of a
// name no worker ever served is ErrUnknownWorkflow, not worth retrying,
// and stores nothing; once no worker runs, the same name is "retry later"
// again (the deployment's workers may be restarting with it), and A is
// "no worker running" with its first worker named.
func TestUnknownWorkflowWhileAWorkerIsLive(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	w := startWorker(t, env.conn(), WorkerConfig{Name: "a-worker"}, threeSteps("wf-a", newCounter()))

	_, err := c.StartByName(ctx, "wf-b", json.RawMessage(`1`), WithRunID("b-1"))
	require.ErrorIs(t, err, ErrUnknownWorkflow)
	require.NotErrorIs(t, err, ErrUnavailable, "a worker runs and none ever served wf-b: not worth retrying")
	require.NotErrorIs(t, err, ErrNoWorker)
	require.Contains(t, err.Error(), `no worker serves "wf-b", and none ever has`)
	_, err = c.GetRun(ctx, "b-1")
	require.ErrorIs(t, err, ErrRunNotFound)

	require.NoError(t, w.Stop(ctx))
	_, err = c.StartByName(ctx, "wf-b", json.RawMessage(`1`), WithRunID("b-1"))
	require.ErrorIs(t, err, ErrNoWorker, "no worker runs: retry later")
	require.NotErrorIs(t, err, ErrUnknownWorkflow)
	_, err = c.StartByName(ctx, "wf-a", json.RawMessage(`1`), WithRunID("a-1"))
	var nw *NoWorkerError
	require.ErrorAs(t, err, &nw)
	require.Equal(t, "a-worker", nw.FirstWorker)
}

// A producer user whose NATS permissions predate the liveness read (an
// accounts.conf without "$JS.API.DIRECT.GET.KV_jetflow_workflows") gets
// "retry later" at once for a start no worker answered, naming the
// refused subject: never "unknown workflow", and no wait for ctx's end.
// It is ErrUnavailable, not ErrPermissionDenied (HTTP 403, which a client
// would not retry): the start itself was allowed, and may succeed later.
func TestUnansweredStartWithoutTheRosterReadPermission(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(accountsConf)
	require.NoError(t, err)
	grant := `"` + rosterRead + `"`
	var kept []string
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		if strings.TrimSpace(line) != grant {
			kept = append(kept, line)
		}
	}
	require.Less(t, len(kept), len(strings.SplitAfter(string(raw), "\n")), "%s grants %s", accountsConf, grant)
	text := strings.Join(kept, "")
	// The passwords in the file, not the environment: t.Setenv would keep
	// the test from running in parallel.
	for v, user := range map[string]string{
		"$JETFLOW_WORKER_PASSWORD": workerUser, "$JETFLOW_PRODUCER_PASSWORD": producerUser, "$JETFLOW_OPERATOR_PASSWORD": operatorUser,
	} {
		text = strings.ReplaceAll(text, "password: "+v, `password: "`+securityPasswords[user]+`"`)
	}
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	require.NoError(t, os.WriteFile(conf, []byte(text), 0o600))
	url := testenv.ConfigServer(t, conf)

	wnc, _ := securedConn(t, url, workerUser)
	stopAtEnd(t, startWorker(t, wnc, WorkerConfig{}, threeSteps("legacy", newCounter())), 10*time.Second)
	pnc, perms := securedConn(t, url, producerUser)
	pc, err := NewClient(ctxT(t, 10*time.Second), pnc, ClientConfig{})
	require.NoError(t, err)

	ctx := ctxT(t, 2*time.Minute)
	_, err = pc.StartByName(ctx, "legacy-typo", json.RawMessage(`1`), WithRunID("l-1"))
	require.NoError(t, ctx.Err(), "answered when the server refused the read, not at ctx's end")
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotErrorIs(t, err, ErrUnknownWorkflow)
	require.NotErrorIs(t, err, ErrPermissionDenied)
	require.Contains(t, err.Error(), "refused a publish to "+rosterRead)
	perms.requireDenied(t, rosterRead)
	_, err = pc.StartByName(ctx, "legacy", json.RawMessage(`1`), WithRunID("l-2"))
	require.NoError(t, err, "a start a worker answers needs no roster read")
}
