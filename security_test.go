package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/sweep"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// The users of deploy/nats/accounts.conf, loaded from that file, so the
// deploy file itself is what is tested.
const (
	accountsConf = "deploy/nats/accounts.conf"

	workerUser          = "jetflow_worker"
	producerUser        = "jetflow_producer"
	operatorUser        = "jetflow_operator"
	trustedProducerUser = "jetflow_trusted_producer"

	// The commented-out trusted producer block sits between these markers.
	trustedBegin = "# >>> trusted producer"
	trustedEnd   = "# <<< trusted producer"
)

var securityPasswords = map[string]string{
	workerUser:          "worker-secret",
	producerUser:        "producer-secret",
	operatorUser:        "operator-secret",
	trustedProducerUser: "trusted-secret",
}

// Least privilege (deploy/nats/accounts.conf): the worker user runs the
// engine; the producer user starts runs only by request-reply or a durable
// start envelope, reads and lists them, and cannot write the run bucket,
// reset a task key, publish a task, or create or delete a stream; the
// operator user may do what the producer does, reset task keys and cancel
// runs (a parent with its child, a child alone), and cannot write an audit
// record or publish a start task; the producer's cancel fails at once with
// ErrPermissionDenied and stores nothing; the direct jetflow.Start needs
// the trusted producer profile and fails, with an error and in bounded
// time, for the producer user.
func TestLeastPrivilegeUsers(t *testing.T) {
	url := securedServer(t)
	ctx := ctxT(t, 120*time.Second)

	// Before any worker has provisioned, NewClient as the producer tries to
	// create the missing stream, which it may not: it fails, it does not hang.
	t.Run("producer NewClient before any worker fails", func(t *testing.T) {
		nc, perms := securedConn(t, url, producerUser)
		_, err := NewClient(ctxT(t, 2*time.Second), nc, ClientConfig{})
		require.Error(t, err)
		perms.requireDenied(t, "$JS.API.STREAM.CREATE.JETFLOW_TASKS")
	})

	// The worker user runs the whole engine: provisioning, consumers, task
	// publishes, KV writes, acks, answers to start requests.
	wnc, workerPerms := securedConn(t, url, workerUser)
	effects := newCounter()
	wf := threeSteps("secure", effects)
	// gated holds its run in a step until release is closed, so a watch
	// sees the run change, not only its final record.
	release := make(chan struct{})
	gated := NewWorkflow("secure-gated", func(ctx *Context, in string) (string, error) {
		return Step(ctx, "wait", func(sctx context.Context) (string, error) {
			select {
			case <-release:
				return in + "!", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		})
	})
	// flaky fails its step once: the retry is a redelivery, which the
	// worker counts in the attempts bucket.
	flaky := NewWorkflow("secure-flaky", func(ctx *Context, _ int) (int, error) {
		return Step(ctx, "call", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			if info.Attempt < 2 {
				return 0, errors.New("upstream unavailable")
			}
			return info.Attempt, nil
		}, WithBackoff(50*time.Millisecond, 100*time.Millisecond), WithMaxAttempts(3))
	})
	// keyed caches its step's result under a task key shared by every run
	// of the workflow; the result is the count of the step's executions.
	keyed := NewWorkflow("secure-keyed", func(ctx *Context, _ int) (int, error) {
		return Step(ctx, "send", func(context.Context) (int, error) {
			return effects.inc("secure-keyed/send"), nil
		}, WithTaskKey("welcome", time.Hour), WithKeyScope(ScopeWorkflow))
	})
	// secure-parent waits for its child secure-kid, whose step holds until
	// it is cancelled: the runs a cancel is tried on.
	kidHeld := make(chan string, 8)
	kid := NewWorkflow("secure-kid", func(ctx *Context, _ int) (int, error) {
		return Step(ctx, "hold", func(sctx context.Context) (int, error) {
			kidHeld <- ctx.RunID()
			<-sctx.Done()
			return 0, sctx.Err()
		})
	})
	parent := NewWorkflow("secure-parent", func(ctx *Context, n int) (int, error) {
		return Child(ctx, kid, n).Get(ctx)
	})
	// secure-hook waits on the hook <input>-approval, secure-signal for the
	// event "go" by run ID: the events a producer sends.
	hookWF := NewWorkflow("secure-hook", func(ctx *Context, in string) (string, error) {
		return WaitEvent[string](ctx, "approval", WithHookToken(in+"-approval"))
	}, WithEvent[string]("approval"))
	signalWF := NewWorkflow("secure-signal", func(ctx *Context, _ int) (string, error) {
		return WaitEvent[string](ctx, "go")
	}, WithEvent[string]("go"))
	// secure-brief waits on a hook too, and its runs are kept for a
	// second after they end: the worker removes their records then.
	brief := NewWorkflow("secure-brief", func(ctx *Context, in string) (string, error) {
		return WaitEvent[string](ctx, "approval", WithHookToken(in+"-brief"))
	}, WithEvent[string]("approval"), WithRetention(time.Second))
	// The sweeper makes a pass every 20ms, so that its reads are
	// exercised under the worker's permissions too.
	sweeps := &passLog{}
	w := startWorker(t, wnc, WorkerConfig{SweepInterval: 20 * time.Millisecond, sweepHook: sweeps.add}, wf, gated, flaky, keyed, kid, parent, hookWF, signalWF, brief)
	stopAtEnd(t, w, 10*time.Second)
	// Worker.Start returns before the server has necessarily registered the
	// start-request subscription; another connection's request could get
	// "no responders" otherwise.
	require.NoError(t, wnc.Flush())

	// The producer user: start by name, wait, read, list steps.
	pnc, producerPerms := securedConn(t, url, producerUser)
	pc, err := NewClient(ctxT(t, 10*time.Second), pnc, ClientConfig{Name: "least-privilege"})
	require.NoError(t, err)
	t.Run("producer starts by name and reads runs", func(t *testing.T) {
		res, err := pc.StartByName(ctx, "secure", json.RawMessage(`1`), WithRunID("sec-1"))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, res.Outcome)

		run, err := pc.WaitRun(ctx, "sec-1")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `4`, string(run.Output))

		dup, err := pc.StartByName(ctx, "secure", json.RawMessage(`1`), WithRunID("sec-1"))
		require.NoError(t, err)
		require.Equal(t, OutcomeExisting, dup.Outcome)
		require.Equal(t, int64(1), dup.Duplicates)

		got, err := pc.GetRun(ctx, "sec-1")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, got.Status)
		require.Equal(t, int64(1), got.Duplicates)

		_, err = pc.GetRun(ctx, "sec-never")
		require.ErrorIs(t, err, ErrRunNotFound)

		steps, err := pc.Steps(ctx, "sec-1")
		require.NoError(t, err)
		require.Len(t, steps, 3)
		for i, name := range []string{"a", "b", "c"} {
			require.Equal(t, name, steps[i].Name)
		}

		// A step retried once.
		_, err = pc.StartByName(ctx, "secure-flaky", json.RawMessage(`0`), WithRunID("sec-flaky"))
		require.NoError(t, err)
		run, err = pc.WaitRun(ctx, "sec-flaky")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `2`, string(run.Output))

		// A watch that is open while the run is still running.
		_, err = pc.StartByName(ctx, "secure-gated", json.RawMessage(`"hi"`), WithRunID("sec-gated"))
		require.NoError(t, err)
		waited := make(chan Run, 1)
		go func() {
			run, err := pc.WaitRun(ctx, "sec-gated")
			if err != nil {
				run.Status = RunStatus("error: " + err.Error())
			}
			waited <- run
		}()
		select {
		case run := <-waited:
			t.Fatalf("WaitRun returned while the run was held: %+v", run)
		case <-time.After(300 * time.Millisecond):
		}
		close(release)
		run = <-waited
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `"hi!"`, string(run.Output))

		producerPerms.requireNone(t)
	})

	// The durable way in: a JetStream publish of the envelope to
	// jetflow.start.<workflow>, admitted by the worker.
	t.Run("producer starts durably by publish", func(t *testing.T) {
		pjs, err := natsjs.New(pnc)
		require.NoError(t, err)
		m := nats.NewMsg("jetflow.start.secure")
		m.Header.Set("Nats-Msg-Id", "sec-durable")
		m.Data = []byte(`{"run_id":"sec-durable","input":2}`)
		_, err = pjs.PublishMsg(ctx, m)
		require.NoError(t, err)
		// Admission is asynchronous: the record appears once a worker
		// has taken the envelope.
		require.Eventually(t, func() bool {
			_, err := pc.GetRun(ctx, "sec-durable")
			return err == nil
		}, 10*time.Second, 10*time.Millisecond)
		run, err := pc.WaitRun(ctx, "sec-durable")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `5`, string(run.Output))
		producerPerms.requireNone(t)
	})

	// ListRuns: direct gets of the run index (JETFLOW_RUN_INDEX), then of
	// the runs and their audits.
	t.Run("producer lists runs", func(t *testing.T) {
		awaitIndexed(t, pc, "sec-durable", StatusCompleted)
		page, err := pc.ListRuns(ctx, ListOptions{Workflow: "secure"})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"sec-1", "sec-durable"}, runIDs(page.Runs))
		require.Empty(t, page.Next)
		for _, r := range page.Runs {
			if r.RunID == "sec-1" {
				require.Equal(t, int64(1), r.Duplicates, "the audit is read too")
			}
		}

		first, err := pc.ListRuns(ctx, ListOptions{Limit: 2})
		require.NoError(t, err)
		require.Len(t, first.Runs, 2)
		require.NotEmpty(t, first.Next)
		rest, err := pc.ListRuns(ctx, ListOptions{After: first.Next, Status: StatusCompleted})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"sec-1", "sec-durable", "sec-flaky", "sec-gated"}, append(runIDs(first.Runs), runIDs(rest.Runs)...))
		counts, err := pc.CountRuns(ctx, "")
		require.NoError(t, err)
		require.Equal(t, RunCounts{Completed: 4}, counts)
		open, err := pc.OpenSteps(ctx, "sec-flaky")
		require.NoError(t, err, "a producer reads the attempt logs")
		require.Empty(t, open)
		steps, err := pc.Steps(ctx, "sec-flaky")
		require.NoError(t, err)
		retried := 0
		for _, s := range steps {
			retried += len(s.Attempts)
		}
		require.Equal(t, 1, retried, "the failed attempt is in the committed step's record")
		roster, err := pc.Roster(ctx)
		require.NoError(t, err, "a producer reads who serves what (producer workers)")
		require.NotEmpty(t, roster.Workers)

		// What producer serve's /readyz asks.
		require.NoError(t, pc.Ready(ctx))
		producerPerms.requireNone(t)
	})

	// Events: Client.Resume and Client.SendEvent, and a raw request on
	// jetflow.events, answered by the worker (which reads and writes
	// jetflow_hooks and jetflow_steps, and subscribes to jetflow.events and
	// jetflow.events.<workflow>).
	t.Run("producer sends an event and resumes a hook", func(t *testing.T) {
		_, err = pc.StartByName(ctx, "secure-hook", json.RawMessage(`"sec-o1"`), WithRunID("sec-hook"))
		require.NoError(t, err)
		// Until the run's wait has registered the token, a resume is
		// ErrHookNotFound and stores nothing.
		var res EventResult
		require.Eventually(t, func() bool {
			res, err = pc.Resume(ctx, "sec-o1-approval", "sec-e1", json.RawMessage(`"approved"`))
			return !errors.Is(err, ErrHookNotFound)
		}, 20*time.Second, 5*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, EventDelivered, res.Outcome)
		run, err := pc.WaitRun(ctx, "sec-hook")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `"approved"`, string(run.Output))

		// By run ID and name; sent before or after the body reaches its
		// wait, it is kept.
		_, err = pc.StartByName(ctx, "secure-signal", json.RawMessage(`0`), WithRunID("sec-signal"))
		require.NoError(t, err)
		res, err = pc.SendEvent(ctx, "sec-signal", "go", "sec-e2", json.RawMessage(`"now"`))
		require.NoError(t, err)
		require.Equal(t, EventDelivered, res.Outcome)
		run, err = pc.WaitRun(ctx, "sec-signal")
		require.NoError(t, err)
		require.JSONEq(t, `"now"`, string(run.Output))

		// Any NATS client with the producer's rights: a plain request.
		reply, err := pnc.RequestWithContext(ctx, "jetflow.events", []byte(`{"token":"sec-nobody","event_id":"e","payload":1}`))
		require.NoError(t, err)
		require.Equal(t, "hook_not_found", errCode(t, reply.Data))
		producerPerms.requireNone(t)
	})

	wjs, err := natsjs.New(wnc)
	require.NoError(t, err)

	// The retention of a run's records: the sweeper stores the expiry of
	// the ended run, and the worker that takes it when it is due reads
	// the run's records and removes its steps, its wait record and its
	// hook token.
	t.Run("worker removes an ended run's records", func(t *testing.T) {
		_, err := pc.StartByName(ctx, "secure-brief", json.RawMessage(`"sec-b1"`), WithRunID("sec-brief"))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			_, err = pc.Resume(ctx, "sec-b1-brief", "sec-e3", json.RawMessage(`"ok"`))
			return !errors.Is(err, ErrHookNotFound)
		}, 20*time.Second, 5*time.Millisecond)
		require.NoError(t, err)
		run, err := pc.WaitRun(ctx, "sec-brief")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		for bucket, key := range map[string]string{
			"jetflow_steps": "sec-brief.hook=approval.0", "jetflow_attempts": "sec-brief.hook=approval.0.wait",
			"jetflow_hooks": "sec-b1-brief",
		} {
			kv, err := wjs.KeyValue(ctx, bucket)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				_, err := kv.Get(ctx, key)
				return errors.Is(err, natsjs.ErrKeyNotFound)
			}, 20*time.Second, 20*time.Millisecond, "%s/%s outlived its run's retention", bucket, key)
		}
		workerPerms.requireNone(t)
	})

	// The operator user: the producer's rights plus task-key reset.
	onc, operatorPerms := securedConn(t, url, operatorUser)
	oc, err := NewClient(ctxT(t, 10*time.Second), onc, ClientConfig{Name: "least-privilege-operator"})
	require.NoError(t, err)

	// No keyed step has run yet, so the task-key bucket does not exist: a
	// reset finds nothing and does not try to create the bucket.
	t.Run("operator reset before the task-key bucket exists", func(t *testing.T) {
		n, err := oc.ResetTaskKey(ctxT(t, 10*time.Second), "welcome", ScopeWorkflow, "secure-keyed")
		require.NoError(t, err)
		require.Zero(t, n)
		_, err = wjs.KeyValue(ctx, "jetflow_taskkeys")
		require.ErrorIs(t, err, natsjs.ErrBucketNotFound)
		operatorPerms.requireNone(t)
	})

	// The first run executes the keyed step; the second is served from the
	// key (the worker creates the bucket on first use).
	t.Run("producer starts keyed runs", func(t *testing.T) {
		for _, id := range []string{"sec-keyed-1", "sec-keyed-2"} {
			_, err := pc.StartByName(ctx, "secure-keyed", json.RawMessage(`0`), WithRunID(id))
			require.NoError(t, err)
			run, err := pc.WaitRun(ctx, id)
			require.NoError(t, err)
			require.Equal(t, StatusCompleted, run.Status)
			require.JSONEq(t, `1`, string(run.Output), "run %s", id)
		}
		require.Equal(t, 1, effects.get("secure-keyed/send"))
		producerPerms.requireNone(t)
	})
	keyName, err := state.TaskKeyName(state.ScopeWorkflow, "secure-keyed", "send", "welcome")
	require.NoError(t, err)
	workerKeys, err := wjs.KeyValue(ctx, "jetflow_taskkeys")
	require.NoError(t, err)

	workerRuns, err := wjs.KeyValue(ctx, "jetflow_runs")
	require.NoError(t, err)
	committed, err := workerRuns.Get(ctx, "sec-1")
	require.NoError(t, err)

	pjs, err := natsjs.New(pnc)
	require.NoError(t, err)

	// Direct admission writes first the run's index entry, then its
	// record; the producer may not, so the write is dropped and its
	// acknowledgement never comes. Start bounds that wait itself (10s)
	// when ctx has no deadline. It runs alongside the checks below.
	type result struct {
		err     error
		elapsed time.Duration
	}
	direct := make(chan result, 1)
	go func() {
		began := time.Now()
		_, err := Start(context.Background(), pc, wf, 7, WithRunID("sec-direct"))
		direct <- result{err, time.Since(began)}
	}()

	t.Run("producer reads which workflows are known and cannot mark one", func(t *testing.T) {
		_, err := pc.StartByName(ctx, "secure-typo", json.RawMessage(`1`), WithRunID("sec-typo"))
		require.ErrorIs(t, err, ErrUnknownWorkflow, "read under the producer's permissions")
		require.NotErrorIs(t, err, ErrUnavailable)
		workflows, err := pjs.KeyValue(ctx, "jetflow_workflows") // a lookup: allowed
		require.NoError(t, err)
		_, err = workflows.Create(ctxT(t, 2*time.Second), "known.secure-typo", []byte(`{}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, `$KV.jetflow_workflows.known.secure-typo`)
	})

	t.Run("producer cannot write the run bucket", func(t *testing.T) {
		runs, err := pjs.KeyValue(ctx, "jetflow_runs") // a lookup: allowed
		require.NoError(t, err)
		_, err = runs.Create(ctxT(t, 2*time.Second), "sec-forged", []byte(`{"forged":true}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, `$KV.jetflow_runs.sec-forged`)
		_, err = runs.Put(ctxT(t, 2*time.Second), "sec-1", []byte(`{"forged":true}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, `$KV.jetflow_runs.sec-1`)

		// Nothing landed: read back through the worker's connection.
		_, err = workerRuns.Get(ctx, "sec-forged")
		require.ErrorIs(t, err, natsjs.ErrKeyNotFound)
		now, err := workerRuns.Get(ctx, "sec-1")
		require.NoError(t, err)
		require.Equal(t, committed.Revision(), now.Revision())
		require.Equal(t, committed.Value(), now.Value())
	})

	t.Run("producer cannot write the hooks or steps bucket", func(t *testing.T) {
		hooks, err := pjs.KeyValue(ctx, "jetflow_hooks") // a lookup: allowed
		require.NoError(t, err)
		_, err = hooks.Create(ctxT(t, 2*time.Second), "sec-forged-approval", []byte(`{"forged":true}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, `$KV.jetflow_hooks.sec-forged-approval`)
		steps, err := pjs.KeyValue(ctx, "jetflow_steps")
		require.NoError(t, err)
		_, err = steps.Put(ctxT(t, 2*time.Second), "sec-hook.hook=approval.0", []byte(`{"forged":true}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, `$KV.jetflow_steps.sec-hook.hook=approval.0`)
		// Nor may it bypass the workers' check of a payload by sending to
		// the subject they forward on.
		require.NoError(t, pnc.Publish("jetflow.events.secure-hook", []byte(`{}`)))
		producerPerms.requireDenied(t, "jetflow.events.secure-hook")

		// Nothing landed: read back through the worker's connection.
		wh, err := wjs.KeyValue(ctx, "jetflow_hooks")
		require.NoError(t, err)
		_, err = wh.Get(ctx, "sec-forged-approval")
		require.ErrorIs(t, err, natsjs.ErrKeyNotFound)
		steps, err = wjs.KeyValue(ctx, "jetflow_steps")
		require.NoError(t, err)
		e, err := steps.Get(ctx, "sec-hook.hook=approval.0")
		require.NoError(t, err)
		require.NotContains(t, string(e.Value()), "forged")
	})

	t.Run("producer cannot publish a task", func(t *testing.T) {
		_, err := pjs.Publish(ctxT(t, 2*time.Second), "jetflow.run.secure.sec-forged", []byte(`{}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, "jetflow.run.secure.sec-forged")
		// A stored start task would have been turned into a run by the worker.
		_, err = pc.GetRun(ctx, "sec-forged")
		require.ErrorIs(t, err, ErrRunNotFound)
	})

	t.Run("producer cannot create or delete streams", func(t *testing.T) {
		err := pjs.DeleteStream(ctxT(t, 2*time.Second), "JETFLOW_TASKS")
		require.Error(t, err)
		producerPerms.requireDenied(t, "$JS.API.STREAM.DELETE.JETFLOW_TASKS")
		err = pjs.DeleteKeyValue(ctxT(t, 2*time.Second), "jetflow_runs")
		require.Error(t, err)
		producerPerms.requireDenied(t, "$JS.API.STREAM.DELETE.KV_jetflow_runs")
		_, err = pjs.CreateStream(ctxT(t, 2*time.Second), natsjs.StreamConfig{Name: "ROGUE", Subjects: []string{"rogue.>"}})
		require.Error(t, err)
		producerPerms.requireDenied(t, "$JS.API.STREAM.CREATE.ROGUE")

		_, err = wjs.Stream(ctx, "JETFLOW_TASKS")
		require.NoError(t, err)
		_, err = wjs.KeyValue(ctx, "jetflow_runs")
		require.NoError(t, err)
	})

	// A reset purges keys, and a purge is a publish to the key's subject,
	// which is also how a forged result would be written: the producer may
	// not. Its ResetTaskKey cannot even look the bucket up, and fails when
	// its context ends; a hand-made purge is dropped.
	t.Run("producer cannot reset a task key", func(t *testing.T) {
		began := time.Now()
		_, err := pc.ResetTaskKey(ctxT(t, 2*time.Second), "welcome", ScopeWorkflow, "secure-keyed")
		require.Error(t, err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(began), 10*time.Second)
		producerPerms.requireDenied(t, "$JS.API.STREAM.INFO.KV_jetflow_taskkeys")

		purge := nats.NewMsg("$KV.jetflow_taskkeys." + keyName)
		purge.Header.Set("KV-Operation", "PURGE")
		purge.Header.Set("Nats-Rollup", "sub")
		_, err = pjs.PublishMsg(ctxT(t, 2*time.Second), purge)
		require.Error(t, err)
		producerPerms.requireDenied(t, "$KV.jetflow_taskkeys."+keyName)

		// The key still holds the cached result.
		e, err := workerKeys.Get(ctx, keyName)
		require.NoError(t, err)
		require.Equal(t, natsjs.KeyValuePut, e.Operation())
	})

	t.Run("operator resets a task key and lists runs", func(t *testing.T) {
		// Bounded on its own: a denied request fails this subtest only.
		n, err := oc.ResetTaskKey(ctxT(t, 10*time.Second), "welcome", ScopeWorkflow, "secure-keyed")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		// A reset writes a reset entry over the key (a purge could be
		// undone by a kill -9 of the server).
		e, err := workerKeys.Get(ctx, keyName)
		require.NoError(t, err)
		reset, err := state.DecodeTaskKeyEntry(e.Value())
		require.NoError(t, err)
		require.Equal(t, state.TaskKeyReset, reset.State)
		n, err = oc.ResetTaskKey(ctxT(t, 10*time.Second), "welcome", ScopeWorkflow, "secure-keyed")
		require.NoError(t, err)
		require.Zero(t, n, "a repeat finds nothing to remove")

		// The next run executes the step again.
		_, err = oc.StartByName(ctx, "secure-keyed", json.RawMessage(`0`), WithRunID("sec-keyed-3"))
		require.NoError(t, err)
		run, err := oc.WaitRun(ctx, "sec-keyed-3")
		require.NoError(t, err)
		require.JSONEq(t, `2`, string(run.Output))
		require.Equal(t, 2, effects.get("secure-keyed/send"))

		awaitIndexed(t, oc, "sec-keyed-3", StatusCompleted)
		page, err := oc.ListRuns(ctx, ListOptions{Workflow: "secure-keyed"})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"sec-keyed-1", "sec-keyed-2", "sec-keyed-3"}, runIDs(page.Runs))
		steps, err := oc.Steps(ctx, "sec-keyed-3")
		require.NoError(t, err)
		require.Len(t, steps, 1)
		// producer serve runs as the operator: its /readyz check passes.
		require.NoError(t, oc.Ready(ctx))
		operatorPerms.requireNone(t)
	})

	// startHeld starts a secure-parent run as c and waits until its child
	// holds its step; it returns the child's run ID.
	startHeld := func(t *testing.T, c *Client, runID string) string {
		t.Helper()
		_, err := c.StartByName(ctx, "secure-parent", json.RawMessage(`1`), WithRunID(runID))
		require.NoError(t, err)
		child := runID + "=secure-kid=0"
		for {
			select {
			case id := <-kidHeld:
				if id == child {
					return child
				}
			case <-ctx.Done():
				t.Fatalf("child %s never started", child)
			}
		}
	}
	// requireStatus waits for runID's final state, read as the producer.
	requireStatus := func(t *testing.T, runID string, want RunStatus) Run {
		t.Helper()
		run, err := pc.WaitRun(ctx, runID)
		require.NoError(t, err)
		require.Equal(t, want, run.Status, "run %s", runID)
		return run
	}

	// The producer may not write a run record: its cancel is refused by
	// the server, and says so at once (not when its context ends, not as
	// a retryable 503). Nothing is stored; the operator's cancel then does
	// the whole job.
	t.Run("producer's cancel is denied at once", func(t *testing.T) {
		held := startHeld(t, oc, "sec-cancel-denied")
		before, err := workerRuns.Get(ctx, "sec-cancel-denied")
		require.NoError(t, err)

		cctx := ctxT(t, 30*time.Second)
		_, err = pc.CancelRun(cctx, "sec-cancel-denied")
		require.ErrorIs(t, err, ErrPermissionDenied)
		require.NotErrorIs(t, err, ErrUnavailable, "not a retryable condition")
		// The cancel's first write is the run's lease.
		require.ErrorContains(t, err, "$KV.jetflow_steps.sec-cancel-denied.lease")
		require.NoError(t, cctx.Err(), "CancelRun waited for its context to end")
		producerPerms.requireDenied(t, "$KV.jetflow_steps.sec-cancel-denied.lease")

		now, err := workerRuns.Get(ctx, "sec-cancel-denied")
		require.NoError(t, err)
		require.Equal(t, before.Revision(), now.Revision(), "the denied cancel stored nothing")
		got, err := pc.GetRun(ctx, "sec-cancel-denied")
		require.NoError(t, err)
		require.Equal(t, StatusRunning, got.Status)

		out, err := oc.CancelRun(ctx, "sec-cancel-denied")
		require.NoError(t, err)
		require.Equal(t, []string{held}, out.Children)
		requireStatus(t, "sec-cancel-denied", StatusCancelled)
		requireStatus(t, held, StatusCancelled)
		operatorPerms.requireNone(t)
	})

	// A cancel hears only the refusals of the writes a cancel makes: a
	// refused write elsewhere on the same connection (another caller's)
	// does not cut it short.
	t.Run("a refused write of another kind does not fail a cancel", func(t *testing.T) {
		wctx, stop := pc.denials.watch(ctx, pnc, cancelWrites...)
		defer stop()
		audits, err := pjs.KeyValue(ctx, "jetflow_audit")
		require.NoError(t, err)
		_, err = audits.Put(ctxT(t, 2*time.Second), "sec-elsewhere", []byte(`{}`))
		require.Error(t, err)
		// The test's handler runs after the client's (CancelRun chained
		// it): once it has the report, the client has had it too.
		producerPerms.requireDenied(t, "$KV.jetflow_audit.sec-elsewhere")
		require.NoError(t, wctx.Err())

		runs, err := pjs.KeyValue(ctx, "jetflow_runs")
		require.NoError(t, err)
		_, err = runs.Put(ctxT(t, 2*time.Second), "sec-elsewhere", []byte(`{}`))
		require.Error(t, err)
		producerPerms.requireDenied(t, "$KV.jetflow_runs.sec-elsewhere")
		require.ErrorIs(t, context.Cause(wctx), ErrPermissionDenied)
	})

	// A parent and its child: both records, the child's commit in its
	// parent (no resume task: the parent has ended) and both notices.
	t.Run("operator cancels a run and its child", func(t *testing.T) {
		held := startHeld(t, oc, "sec-cancel-op")
		out, err := oc.CancelRun(ctx, "sec-cancel-op")
		require.NoError(t, err)
		require.Equal(t, StatusCancelled, out.Status)
		require.False(t, out.AlreadyCancelled)
		require.Equal(t, []string{held}, out.Children)
		requireStatus(t, "sec-cancel-op", StatusCancelled)
		requireStatus(t, held, StatusCancelled)

		again, err := oc.CancelRun(ctx, "sec-cancel-op")
		require.NoError(t, err)
		require.True(t, again.AlreadyCancelled)
		operatorPerms.requireNone(t)
	})

	// A child alone: the operator commits the parent's step with the
	// child's cancellation and publishes the parent's resume task, and
	// the parent, which is still running, fails with the child's error.
	t.Run("operator cancels a child and its parent resumes", func(t *testing.T) {
		held := startHeld(t, oc, "sec-cancel-kid")
		out, err := oc.CancelRun(ctx, held)
		require.NoError(t, err)
		require.Equal(t, StatusCancelled, out.Status)
		requireStatus(t, held, StatusCancelled)
		run := requireStatus(t, "sec-cancel-kid", StatusFailed)
		require.NotNil(t, run.Error)
		require.Contains(t, run.Error.Message, "child run "+held+" was cancelled")
		steps, err := oc.Steps(ctx, "sec-cancel-kid")
		require.NoError(t, err)
		require.Len(t, steps, 1)
		require.Equal(t, held, steps[0].Child)
		operatorPerms.requireNone(t)
	})

	// Beyond task keys and cancels the operator is a producer: no audit
	// record, no start task (so no direct Start).
	t.Run("operator cannot write an audit or publish a start task", func(t *testing.T) {
		ojs, err := natsjs.New(onc)
		require.NoError(t, err)
		audits, err := ojs.KeyValue(ctx, "jetflow_audit")
		require.NoError(t, err)
		_, err = audits.Put(ctxT(t, 2*time.Second), "sec-1", []byte(`{"forged":true}`))
		require.Error(t, err)
		operatorPerms.requireDenied(t, "$KV.jetflow_audit.sec-1")
		_, err = ojs.Publish(ctxT(t, 2*time.Second), "jetflow.run.secure.sec-op-forged", []byte(`{}`))
		require.Error(t, err)
		operatorPerms.requireDenied(t, "jetflow.run.secure.sec-op-forged")

		now, err := workerRuns.Get(ctx, "sec-1")
		require.NoError(t, err)
		require.Equal(t, committed.Revision(), now.Revision())
		_, err = pc.GetRun(ctx, "sec-op-forged")
		require.ErrorIs(t, err, ErrRunNotFound)
	})

	t.Run("producer's direct Start fails in bounded time", func(t *testing.T) {
		var r result
		select {
		case r = <-direct:
		case <-time.After(30 * time.Second):
			t.Fatal("direct Start as the producer user did not return")
		}
		require.Error(t, r.err)
		require.ErrorIs(t, r.err, context.DeadlineExceeded)
		require.Less(t, r.elapsed, 15*time.Second)
		producerPerms.requireDenied(t, "jetflow.runindex.e.running.secure.s.e.c.-.d.i.r.e.c.t.~")
		_, err := pc.GetRun(ctx, "sec-direct")
		require.ErrorIs(t, err, ErrRunNotFound)
	})

	// The worker's sweeper finds a run left without a task and resumes it.
	t.Run("worker sweeper resumes a stuck run", func(t *testing.T) {
		assets, err := jetstream.Provision(ctx, wnc, jetstream.Topology{}, jetstream.Ensure)
		require.NoError(t, err)
		writeStuckRun(t, assets, "secure", "sec-stuck", 0, `1`, `2`)
		run, err := pc.WaitRun(ctx, "sec-stuck")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `4`, string(run.Output))
		require.Equal(t, 1, sweeps.count("sec-stuck", func(p sweep.Pass) []string { return p.Redispatched }))
		require.Zero(t, sweeps.errors(), "sweep passes failed")
	})

	// The trusted producer profile (the commented block of accounts.conf)
	// is what direct admission needs.
	t.Run("trusted producer starts directly", func(t *testing.T) {
		tnc, trustedPerms := securedConn(t, url, trustedProducerUser)
		tc, err := NewClient(ctxT(t, 10*time.Second), tnc, ClientConfig{})
		require.NoError(t, err)
		h, err := Start(ctx, tc, wf, 5, WithRunID("sec-trusted"))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, h.Outcome)
		out, err := h.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, 8, out)
		dup, err := Start(ctx, tc, wf, 5, WithRunID("sec-trusted"))
		require.NoError(t, err)
		require.Equal(t, OutcomeExisting, dup.Outcome)
		steps, err := tc.Steps(ctx, "sec-trusted")
		require.NoError(t, err)
		require.Len(t, steps, 3)
		trustedPerms.requireNone(t)
	})

	// The trusted producer may cancel too, a child included (its parent's
	// step and resume task).
	t.Run("trusted producer cancels a child", func(t *testing.T) {
		tnc, trustedPerms := securedConn(t, url, trustedProducerUser)
		tc, err := NewClient(ctxT(t, 10*time.Second), tnc, ClientConfig{})
		require.NoError(t, err)
		held := startHeld(t, tc, "sec-cancel-trusted")
		_, err = tc.CancelRun(ctx, held)
		require.NoError(t, err)
		requireStatus(t, held, StatusCancelled)
		requireStatus(t, "sec-cancel-trusted", StatusFailed)
		trustedPerms.requireNone(t)
	})

	// A producer that lists past a stale index entry may not repair it:
	// the server's refusal is seen at once (the page does not wait for its
	// deadline), the client stops trying, and the page is right. An
	// operator's listing repairs it.
	t.Run("producer lists past a stale index entry", func(t *testing.T) {
		pnc2, perms := securedConn(t, url, producerUser)
		pc2, err := NewClient(ctxT(t, 10*time.Second), pnc2, ClientConfig{})
		require.NoError(t, err)
		stale, err := json.Marshal(map[string]any{"v": 1, "run_id": "sec-1", "workflow": "secure", "status": "running"})
		require.NoError(t, err)
		_, err = wjs.Publish(ctx, "jetflow.runindex.e.running.secure.s.e.c.-.1.~", stale) // the worker's rights
		require.NoError(t, err)
		// A deadline of the listing's own (not what is left of the
		// test's, which a loaded machine may have used up).
		const listTimeout = 30 * time.Second
		lctx, cancel := context.WithTimeout(context.Background(), listTimeout)
		defer cancel()
		began := time.Now()
		for range 2 {
			page, err := pc2.ListRuns(lctx, ListOptions{Workflow: "secure", Status: StatusRunning})
			require.NoError(t, err)
			require.Empty(t, page.Runs, "the stale entry is not listed")
			require.Less(t, time.Since(began), listTimeout/2, "a refused repair must not wait for the deadline")
		}
		perms.requireDenied(t, "$JS.API.STREAM.PURGE.JETFLOW_RUN_INDEX")
		require.Len(t, perms.snapshot(), 1, "one refusal: the client does not try again")

		onc2, operatorPerms2 := securedConn(t, url, operatorUser)
		oc2, err := NewClient(ctxT(t, 10*time.Second), onc2, ClientConfig{})
		require.NoError(t, err)
		counts, err := oc2.CountRuns(ctx, "secure")
		require.NoError(t, err)
		require.Equal(t, int64(1), counts.Running, "the stale entry is still there")
		_, err = oc2.ListRuns(ctx, ListOptions{Workflow: "secure", Status: StatusRunning})
		require.NoError(t, err)
		counts, err = oc2.CountRuns(ctx, "secure")
		require.NoError(t, err)
		require.Zero(t, counts.Running, "the operator's listing repaired the index")
		operatorPerms2.requireNone(t)
	})

	// A rerun by the producer user: planned from what it may read, admitted
	// (and listed in the source's audit) by a worker.
	t.Run("producer reruns a run by request", func(t *testing.T) {
		rc, err := NewClient(ctxT(t, 10*time.Second), pnc, ClientConfig{Name: "least-privilege", StartByRequest: true})
		require.NoError(t, err)
		res, err := rc.Rerun(ctx, "sec-1", RerunOptions{From: "b"})
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, res.Start.Outcome)
		require.Equal(t, []string{"a"}, stepNames(res.Kept))
		run, err := rc.WaitRun(ctx, "sec-1-rerun-b-0")
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
		require.JSONEq(t, `4`, string(run.Output))
		require.Equal(t, &RerunOf{RunID: "sec-1", From: "sec-1.b.0"}, run.RerunOf)
		source, err := rc.GetRun(ctx, "sec-1")
		require.NoError(t, err)
		require.Len(t, source.Reruns, 1)
	})

	// The worker did all of the above without a single denied operation,
	// including its drain.
	require.NoError(t, w.Stop(ctxT(t, 10*time.Second)))
	workerPerms.requireNone(t)

}

// errCode is the error code of an event reply, which must have no outcome
// and a message.
func errCode(t *testing.T, reply []byte) string {
	t.Helper()
	var r struct {
		Outcome string `json:"outcome"`
		Error   struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(reply, &r), string(reply))
	require.Empty(t, r.Outcome, string(reply))
	require.NotEmpty(t, r.Error.Message, string(reply))
	return r.Error.Code
}

func runIDs(runs []Run) []string {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.RunID
	}
	return ids
}

// securedServer starts a nats-server with JetStream and the users of
// deploy/nats/accounts.conf (the trusted producer block uncommented), and
// returns its URL. Passwords come from the environment, as in production.
func securedServer(t *testing.T) string {
	t.Helper()
	return securedServerEdited(t, func(conf string) string { return conf })
}

// securedServerEdited is securedServer with accounts.conf passed through
// edit first.
func securedServerEdited(t *testing.T, edit func(conf string) string) string {
	t.Helper()
	for _, env := range []struct{ name, user string }{
		{"JETFLOW_WORKER_PASSWORD", workerUser},
		{"JETFLOW_PRODUCER_PASSWORD", producerUser},
		{"JETFLOW_OPERATOR_PASSWORD", operatorUser},
		{"JETFLOW_TRUSTED_PRODUCER_PASSWORD", trustedProducerUser},
	} {
		t.Setenv(env.name, securityPasswords[env.user])
	}
	raw, err := os.ReadFile(accountsConf)
	require.NoError(t, err)
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	require.NoError(t, os.WriteFile(conf, []byte(edit(uncommentTrusted(t, string(raw)))), 0o600))

	return testenv.ConfigServer(t, conf)
}

// uncommentTrusted removes the comment mark of each line between the
// trusted producer markers, as an operator enabling the profile would.
func uncommentTrusted(t *testing.T, conf string) string {
	t.Helper()
	lines := strings.Split(conf, "\n")
	in, found := false, false
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == trustedBegin:
			in, found = true, true
		case trimmed == trustedEnd:
			in = false
		case in:
			at := strings.Index(line, "#")
			require.GreaterOrEqual(t, at, 0, "line %d of the trusted producer block is not commented", i+1)
			lines[i] = line[:at] + strings.TrimPrefix(line[at+1:], " ")
		}
	}
	require.True(t, found, "no trusted producer block in %s", accountsConf)
	require.False(t, in, "trusted producer block in %s is not closed", accountsConf)
	return strings.Join(lines, "\n")
}

// permErrors collects the asynchronous errors the server sends a
// connection; a denied publish shows up only there (its request times out).
type permErrors struct {
	mu   sync.Mutex
	errs []string
}

func (p *permErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err.Error())
}

func (p *permErrors) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// requireDenied waits for the server's permission violation on a publish to
// subject.
func (p *permErrors) requireDenied(t *testing.T, subject string) {
	t.Helper()
	want := `Permissions Violation for Publish to "` + subject + `"`
	require.Eventually(t, func() bool {
		for _, e := range p.snapshot() {
			if strings.Contains(e, want) {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "no permission violation for %s; got %v", subject, p.snapshot())
}

// requireNone fails if the server reported any error to the connection,
// such as a denied publish or subscription.
func (p *permErrors) requireNone(t *testing.T) {
	t.Helper()
	require.Empty(t, p.snapshot(), "the server refused operations")
}

// securedConn connects as user; the connection is closed when t ends.
func securedConn(t *testing.T, url, user string) (*nats.Conn, *permErrors) {
	t.Helper()
	perms := &permErrors{}
	nc, err := Connect(url,
		nats.Name(t.Name()+"/"+user),
		nats.UserInfo(user, securityPasswords[user]),
		nats.ErrorHandler(perms.handler),
	)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, perms
}

// A producer whose user may not make the batch read of a run's steps (an
// accounts.conf from before that read) gets ErrPermissionDenied from
// Steps at once, naming the subject, not a timeout reported as NATS being
// unavailable.
func TestStepsBatchReadDeniedFailsAtOnce(t *testing.T) {
	const grant = "\"$JS.API.DIRECT.GET.KV_jetflow_steps\"\n"
	url := securedServerEdited(t, func(conf string) string {
		// The producer's and the operator's grant, not the worker's.
		const mark = "# without a key; the request names the keys).\n"
		i := strings.Index(conf, mark)
		require.GreaterOrEqual(t, i, 0, "accounts.conf has no batch read grant for producers")
		head, rest := conf[:i+len(mark)], conf[i+len(mark):]
		j := strings.Index(rest, grant)
		require.GreaterOrEqual(t, j, 0)
		return head + rest[:j] + rest[j+len(grant):]
	})
	wnc, _ := securedConn(t, url, workerUser)
	wf := threeSteps("denied-steps", newCounter())
	w := startWorker(t, wnc, WorkerConfig{}, wf)
	stopAtEnd(t, w, 10*time.Second)
	pnc, _ := securedConn(t, url, producerUser)
	ctx := ctxT(t, 30*time.Second)
	c, err := NewClient(ctx, pnc, ClientConfig{})
	require.NoError(t, err)
	_, err = c.StartByName(ctx, "denied-steps", json.RawMessage(`1`), WithRunID("denied-1"))
	require.NoError(t, err)
	_, err = c.WaitRun(ctx, "denied-1")
	require.NoError(t, err)

	_, err = c.Steps(ctx, "denied-1")
	require.ErrorIs(t, err, ErrPermissionDenied)
	require.NotErrorIs(t, err, ErrUnavailable)
	require.Contains(t, err.Error(), "$JS.API.DIRECT.GET.KV_jetflow_steps")
	require.NoError(t, ctx.Err(), "the refusal ended the read, not the context")
}
