package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// keyed is a workflow with one step, "lookup", called with the task key
// given as the run's input and the options opts. The step body is body.
func keyed(name string, body func(ctx context.Context) (string, error), opts ...StepOption) *Workflow[string, string] {
	return NewWorkflow(name, func(ctx *Context, key string) (string, error) {
		return Step(ctx, "lookup", body, append([]StepOption{WithTaskKey(key, time.Minute)}, opts...)...)
	})
}

// counted is a step body that counts its runs and returns "run-<n>".
func counted(n *atomic.Int64) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		return fmt.Sprintf("run-%d", n.Add(1)), nil
	}
}

// runKeyed starts wf with input key under runID and waits for its result.
func runKeyed(t *testing.T, c *Client, wf *Workflow[string, string], runID, key string) (string, error) {
	t.Helper()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, key, WithRunID(runID))
	require.NoError(t, err)
	return h.Result(ctxT(t, 60*time.Second))
}

// keyRef reads the task key reference stored with a committed step record.
func keyRef(t *testing.T, c *Client, stepID string) *state.StepKeyRef {
	t.Helper()
	v, _, err := c.assets.Steps.Get(ctxT(t, 5*time.Second), stepID)
	require.NoError(t, err)
	var ks state.KeyedStep
	require.NoError(t, json.Unmarshal(v, &ks))
	return ks.TaskKey
}

// served reports whether the step was served from its task key, from the
// stored record and from what Client.Steps shows, which must agree.
func served(t *testing.T, c *Client, runID string) bool {
	t.Helper()
	ref := keyRef(t, c, runID+".lookup.0")
	require.NotNil(t, ref, "a keyed step's record names its key")
	steps, err := c.Steps(ctxT(t, 5*time.Second), runID)
	require.NoError(t, err)
	require.NotEmpty(t, steps)
	require.Equal(t, ref.Served, strings.Contains(steps[0].Worker, "served from task key "+ref.Key), steps[0].Worker)
	require.Equal(t, &StepTaskKey{Key: ref.Key, Served: ref.Served, From: ref.From}, steps[0].TaskKey)
	return ref.Served
}

// G7: 50 concurrent calls with one key run the step once and every caller
// gets its result: 50 runs of a workflow scoped key, and 50 runs of two
// workflows sharing a global key.
func TestTaskKeyConcurrentCallsRunOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		scope KeyScope
		wfs   int
	}{
		{"workflow-scope", ScopeWorkflow, 1},
		{"global-scope", ScopeGlobal, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t, Topology{})
			var runs atomic.Int64
			gate := make(chan struct{})
			body := func(ctx context.Context) (string, error) {
				n := runs.Add(1)
				select { // hold the key until every run has been started
				case <-gate:
				case <-ctx.Done():
					return "", ctx.Err()
				}
				return fmt.Sprintf("run-%d", n), nil
			}
			var wfs []*Workflow[string, string]
			var regs []Registrable
			for i := range tc.wfs {
				wf := keyed(fmt.Sprintf("conc%d", i), body, WithKeyScope(tc.scope))
				wfs, regs = append(wfs, wf), append(regs, wf)
			}
			env.worker(WorkerConfig{}, regs...)
			c := env.client()

			const n = 50
			handles := make([]*Handle[string], n)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					h, err := Start(ctxT(t, 10*time.Second), c, wfs[i%len(wfs)], "shared", WithRunID(fmt.Sprintf("conc-%d", i)))
					handles[i] = h
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			// Keep the key claimed until the other start tasks the worker
			// runs at once (a quarter of its 64 slots) are all waiting for
			// it: each waiter watches the key with a consumer of its own.
			require.Eventually(t, func() bool {
				st, err := c.assets.JS.Stream(context.Background(), "KV_"+jetstream.TaskKeysBucket)
				return err == nil && st.CachedInfo().State.Consumers >= 64/4-1
			}, 30*time.Second, 10*time.Millisecond, "callers waiting for the key")
			close(gate)

			var servedN int
			for i, h := range handles {
				out, err := h.Result(ctxT(t, 60*time.Second))
				require.NoError(t, err)
				require.Equal(t, "run-1", out, "run %d", i)
				if served(t, c, h.RunID) {
					servedN++
				}
			}
			require.EqualValues(t, 1, runs.Load(), "the step function ran more than once")
			require.Equal(t, n-1, servedN, "every run but the one that ran the step is served from the key")
		})
	}
}

// G7: a failed result is not cached; the retry runs and its success is.
func TestTaskKeyFailureIsNotCachedAndTheRetryIsCached(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var withinRun, acrossRuns, cachedFail atomic.Int64
	retried := keyed("retried", func(context.Context) (string, error) {
		if n := withinRun.Add(1); n == 1 {
			return "", errors.New("flaky")
		}
		return "ok", nil
	}, WithKeyScope(ScopeWorkflow), WithBackoff(time.Millisecond, time.Millisecond))
	oneShot := keyed("one-shot", func(context.Context) (string, error) {
		if n := acrossRuns.Add(1); n == 1 {
			return "", errors.New("down")
		}
		return "ok", nil
	}, WithKeyScope(ScopeWorkflow), WithMaxAttempts(1))
	failCached := keyed("fail-cached", func(context.Context) (string, error) {
		cachedFail.Add(1)
		return "", Fatal(errors.New("no such user"))
	}, WithKeyScope(ScopeWorkflow), WithCachedFailures())
	env.worker(WorkerConfig{}, retried, oneShot, failCached)
	c := env.client()

	// Within one run: attempt 1 fails (not cached), attempt 2 succeeds
	// (cached); another run gets it without running.
	out, err := runKeyed(t, c, retried, "retried-1", "k")
	require.NoError(t, err)
	require.Equal(t, "ok", out)
	out, err = runKeyed(t, c, retried, "retried-2", "k")
	require.NoError(t, err)
	require.Equal(t, "ok", out)
	require.EqualValues(t, 2, withinRun.Load())
	require.False(t, served(t, c, "retried-1"))
	require.True(t, served(t, c, "retried-2"))

	// Across runs: the first run's final failure is not cached, the second
	// run runs the step, the third is served.
	_, err = runKeyed(t, c, oneShot, "one-shot-1", "k")
	require.ErrorIs(t, err, ErrRunFailed)
	for _, id := range []string{"one-shot-2", "one-shot-3"} {
		out, err := runKeyed(t, c, oneShot, id, "k")
		require.NoError(t, err)
		require.Equal(t, "ok", out)
	}
	require.EqualValues(t, 2, acrossRuns.Load())
	require.False(t, served(t, c, "one-shot-2"))
	require.True(t, served(t, c, "one-shot-3"))

	// WithCachedFailures: the failure is served like a result.
	for _, id := range []string{"fail-cached-1", "fail-cached-2"} {
		_, err := runKeyed(t, c, failCached, id, "k")
		var re *RunError
		require.ErrorAs(t, err, &re)
		require.Contains(t, re.Message, "no such user")
	}
	require.EqualValues(t, 1, cachedFail.Load())
	require.True(t, served(t, c, "fail-cached-2"))
}

// G7, G9: the key is returned within its TTL and expires after it, by the
// broker's per-key TTL; then the step runs again.
func TestTaskKeyExpiresAfterTTL(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ttl = 2 * time.Second
	var runs atomic.Int64
	var wroteAt atomic.Int64
	wf := NewWorkflow("expiring", func(ctx *Context, key string) (string, error) {
		return Step(ctx, "lookup", func(context.Context) (string, error) {
			wroteAt.Store(time.Now().UnixNano()) // before the key's write
			return fmt.Sprintf("run-%d", runs.Add(1)), nil
		}, WithTaskKey(key, ttl), WithKeyScope(ScopeWorkflow))
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	out, err := runKeyed(t, c, wf, "ttl-1", "k")
	require.NoError(t, err)
	require.Equal(t, "run-1", out)
	out, err = runKeyed(t, c, wf, "ttl-2", "k")
	require.NoError(t, err)
	require.Less(t, time.Since(time.Unix(0, wroteAt.Load())), ttl, "the second run came too late to test the cache")
	require.Equal(t, "run-1", out, "within the TTL the result is served")
	require.True(t, served(t, c, "ttl-2"))

	bkey, err := state.TaskKeyName(state.ScopeWorkflow, "expiring", "lookup", "k")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := c.assets.TaskKeys.Latest(context.Background(), bkey)
		return err == nil && !st.Live
	}, 15*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(time.Unix(0, wroteAt.Load())), ttl, "the key expired before its TTL")

	out, err = runKeyed(t, c, wf, "ttl-3", "k")
	require.NoError(t, err)
	require.Equal(t, "run-2", out, "after the TTL the step runs again")
	require.False(t, served(t, c, "ttl-3"))
}

// G7: ResetTaskKey makes the next call run the step again.
func TestTaskKeyReset(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var runs atomic.Int64
	wf := keyed("resettable", counted(&runs), WithKeyScope(ScopeWorkflow))
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	for i, want := range []string{"run-1", "run-1"} {
		out, err := runKeyed(t, c, wf, fmt.Sprintf("reset-%d", i), "k")
		require.NoError(t, err)
		require.Equal(t, want, out)
	}
	n, err := c.ResetTaskKey(ctxT(t, 5*time.Second), "k", ScopeWorkflow, "resettable")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	for i, want := range []string{"run-2", "run-2"} {
		out, err := runKeyed(t, c, wf, fmt.Sprintf("reset-after-%d", i), "k")
		require.NoError(t, err)
		require.Equal(t, want, out)
	}
	require.EqualValues(t, 2, runs.Load())

	// Resetting another key, scope or workflow touches nothing.
	for _, tc := range []struct {
		key     string
		scope   KeyScope
		scopeID string
	}{
		{"other", ScopeWorkflow, "resettable"},
		{"k", ScopeWorkflow, "another"},
		{"k", ScopeGlobal, ""},
		{"k", ScopeRun, "reset-0"},
	} {
		n, err := c.ResetTaskKey(ctxT(t, 5*time.Second), tc.key, tc.scope, tc.scopeID)
		require.NoError(t, err)
		require.Zero(t, n, "%+v", tc)
	}
	for _, bad := range []struct {
		key     string
		scope   KeyScope
		scopeID string
	}{
		{"", ScopeWorkflow, "resettable"},
		{"k", ScopeWorkflow, ""},
		{"k", ScopeRun, "bad.id"},
		{"k", ScopeGlobal, "x"},
		{"k", KeyScope(9), ""},
	} {
		_, err := c.ResetTaskKey(ctxT(t, 5*time.Second), bad.key, bad.scope, bad.scopeID)
		require.ErrorIs(t, err, ErrInvalidKey, "%+v", bad)
	}
}

// G7: scopes isolate as documented. Run scope: private to the run (two
// runs both run; a repeat call within the run is served). Workflow scope:
// another workflow with the same key runs. Global: shared across
// workflows. A different key, or another step using the same key, runs.
func TestTaskKeyScopes(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var runScoped, wfA, wfB, globalRuns, otherStep atomic.Int64
	perRun := NewWorkflow("per-run", func(ctx *Context, key string) ([]string, error) {
		var outs []string
		for range 2 { // the same key twice in one run
			out, err := Step(ctx, "lookup", counted(&runScoped), WithTaskKey(key, time.Minute))
			if err != nil {
				return nil, err
			}
			outs = append(outs, out)
		}
		out, err := Step(ctx, "other-step", counted(&otherStep), WithTaskKey(key, time.Minute))
		return append(outs, out), err
	})
	a := keyed("wf-a", counted(&wfA), WithKeyScope(ScopeWorkflow))
	b := keyed("wf-b", counted(&wfB), WithKeyScope(ScopeWorkflow))
	globalBody := counted(&globalRuns)
	ga := keyed("global-a", globalBody, WithKeyScope(ScopeGlobal))
	gb := keyed("global-b", globalBody, WithKeyScope(ScopeGlobal))
	env.worker(WorkerConfig{}, perRun, a, b, ga, gb)
	c := env.client()

	// Run scope.
	for i, id := range []string{"per-run-1", "per-run-2"} {
		h, err := Start(ctxT(t, 10*time.Second), c, perRun, "k", WithRunID(id))
		require.NoError(t, err)
		outs, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err)
		want := fmt.Sprintf("run-%d", i+1)
		require.Equal(t, []string{want, want, want}, outs, "second call served within the run; another step runs")
		require.True(t, keyRef(t, c, id+".lookup.1").Served)
		require.False(t, keyRef(t, c, id+".other-step.0").Served)
	}
	require.EqualValues(t, 2, runScoped.Load(), "each run runs the step once")
	require.EqualValues(t, 2, otherStep.Load(), "a step never reads another step's result")

	// Workflow scope.
	for _, tc := range []struct {
		wf      *Workflow[string, string]
		runID   string
		key     string
		want    string
		served  bool
		counter *atomic.Int64
	}{
		{a, "a-1", "k", "run-1", false, &wfA},
		{a, "a-2", "k", "run-1", true, &wfA},
		{b, "b-1", "k", "run-1", false, &wfB},
		{a, "a-3", "k2", "run-2", false, &wfA},
		{ga, "ga-1", "k", "run-1", false, &globalRuns},
		{gb, "gb-1", "k", "run-1", true, &globalRuns},
		{gb, "gb-2", "k2", "run-2", false, &globalRuns},
		{ga, "ga-2", "k2", "run-2", true, &globalRuns},
	} {
		out, err := runKeyed(t, c, tc.wf, tc.runID, tc.key)
		require.NoError(t, err)
		require.Equal(t, tc.want, out, tc.runID)
		require.Equal(t, tc.served, served(t, c, tc.runID), tc.runID)
	}
	require.EqualValues(t, 2, wfA.Load())
	require.EqualValues(t, 1, wfB.Load())
	require.EqualValues(t, 2, globalRuns.Load())
}

// G7, G12: bad task key options are a typed error from Step; nothing runs.
func TestTaskKeyInvalidOptions(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	cases := [][]StepOption{
		{WithTaskKey("", time.Minute)},
		{WithTaskKey(strings.Repeat("k", MaxTaskKeyLen+1), time.Minute)},
		{WithTaskKey("k", 500*time.Millisecond)},
		{WithTaskKey("k", 0)},
		{WithTaskKey("k", time.Minute), WithKeyScope(KeyScope(9))},
		{WithTaskKey("k", time.Minute), WithKeyLease(10 * time.Millisecond)},
		{WithKeyScope(ScopeGlobal)},
		{WithCachedFailures()},
	}
	var ran atomic.Int64
	wf := NewWorkflow("invalid-keys", func(ctx *Context, i int) (string, error) {
		_, err := Step(ctx, "s", func(context.Context) (int, error) { ran.Add(1); return 0, nil }, cases[i]...)
		if !errors.Is(err, ErrInvalidKey) {
			return "", fmt.Errorf("case %d: got %v, want ErrInvalidKey", i, err)
		}
		return err.Error(), nil
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	for i := range cases {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, i, WithRunID(fmt.Sprintf("invalid-%d", i)))
		require.NoError(t, err)
		msg, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err)
		t.Logf("case %d: %s", i, msg)
	}
	require.Zero(t, ran.Load())
}

// The crash case: the worker holding a key's claim is SIGKILLed in the
// middle of the step. Another run's call waits, and takes the key over once
// the claim's lease has passed without renewal (the broker expires it), and
// runs the step itself.
const (
	taskKeyChildEnv = "JETFLOW_TEST_TASKKEY_CHILD"
	taskKeyLease    = 2 * time.Second
	// A long AckWait keeps the killed run's own task from coming back (and
	// reclaiming its key at once) during the test.
	taskKeyAckWait = time.Minute
)

func init() {
	// The child process of TestTaskKeyClaimOfACrashedWorkerIsTakenOver
	// (this test binary re-executed); see child_test.go for the pattern.
	if os.Getenv(taskKeyChildEnv) != "" {
		os.Exit(runTaskKeyChild())
	}
}

func crashKeyWorkflow(body func(context.Context) (string, error)) *Workflow[string, string] {
	return keyed("key-crash", body, WithKeyScope(ScopeWorkflow), WithKeyLease(taskKeyLease))
}

func runTaskKeyChild() int {
	nc, err := jetstream.Connect(os.Getenv(childURLEnv), "taskkey-child")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ws := NewRegistry()
	if err := ws.Register(crashKeyWorkflow(func(context.Context) (string, error) {
		killSelf() // holding the claim
		return "", nil
	})); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w, err := NewWorker(nc, ws, WorkerConfig{AckWait: taskKeyAckWait, Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel)})
	if err == nil {
		err = w.Start(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // until the step kills the process
}

func TestTaskKeyClaimOfACrashedWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()

	cmd, err := spawnTaskKeyChild(t, env)
	require.NoError(t, err)
	wf := crashKeyWorkflow(func(context.Context) (string, error) { return "unused", nil })
	_, err = Start(ctxT(t, 10*time.Second), c, wf, "shared", WithRunID("holder"))
	require.NoError(t, err)
	waitKilled(t, cmd, 30*time.Second)

	// The dead worker's claim is in the bucket.
	bkey, err := state.TaskKeyName(state.ScopeWorkflow, "key-crash", "lookup", "shared")
	require.NoError(t, err)
	st, err := c.assets.TaskKeys.Latest(ctxT(t, 5*time.Second), bkey)
	require.NoError(t, err)
	require.True(t, st.Live)
	claim, err := state.DecodeTaskKeyEntry(st.Value)
	require.NoError(t, err)
	require.Equal(t, state.TaskKeyClaimed, claim.State)
	require.Equal(t, "holder.lookup.0", claim.Owner)
	require.Equal(t, taskKeyLease, claim.Lease())

	var runs atomic.Int64
	env.worker(WorkerConfig{AckWait: taskKeyAckWait}, crashKeyWorkflow(counted(&runs)))
	out, err := runKeyed(t, c, wf, "waiter", "shared")
	require.NoError(t, err)
	require.Equal(t, "run-1", out)
	require.EqualValues(t, 1, runs.Load())
	require.False(t, served(t, c, "waiter"), "the waiter ran the step itself")
	require.False(t, time.Now().Before(claim.LeaseUntil.Add(-250*time.Millisecond)),
		"the claim was taken over before its lease ran out")

	// The key now holds the waiter's result.
	st, err = c.assets.TaskKeys.Latest(ctxT(t, 5*time.Second), bkey)
	require.NoError(t, err)
	done, err := state.DecodeTaskKeyEntry(st.Value)
	require.NoError(t, err)
	require.Equal(t, state.TaskKeyDone, done.State)
	require.Equal(t, "waiter.lookup.0", done.Owner)
}

func spawnTaskKeyChild(t *testing.T, env *testEnv) (*exec.Cmd, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), taskKeyChildEnv+"=1", childURLEnv+"="+env.srv.ClientURL())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, nil
}

// A claim that is not renewed within its lease is taken over by a waiter's
// own clock even when the broker has not expired it (its message TTL here is
// far longer than the lease it announces), and a malformed entry never blocks
// its key.
func TestTaskKeyStaleOrMalformedEntryIsTakenOver(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var runs atomic.Int64
	wf := keyed("stale", counted(&runs), WithKeyScope(ScopeWorkflow))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	tk := c.assets.TaskKeys

	stale, err := state.TaskKeyName(state.ScopeWorkflow, "stale", "lookup", "stale")
	require.NoError(t, err)
	claim, err := state.Encode(state.TaskKeyEntry{
		V: state.Version, State: state.TaskKeyClaimed, Owner: "ghost.lookup.0", Token: "t",
		LeaseMS: time.Second.Milliseconds(), At: time.Now().UTC(),
	})
	require.NoError(t, err)
	_, err = tk.Create(ctxT(t, 5*time.Second), stale, claim, 0, time.Hour)
	require.NoError(t, err)
	t0 := time.Now()
	out, err := runKeyed(t, c, wf, "after-stale", "stale")
	require.NoError(t, err)
	require.Equal(t, "run-1", out)
	require.GreaterOrEqual(t, time.Since(t0), time.Second, "taken over before the lease passed")

	bad, err := state.TaskKeyName(state.ScopeWorkflow, "stale", "lookup", "bad")
	require.NoError(t, err)
	_, err = tk.Create(ctxT(t, 5*time.Second), bad, []byte("not an entry"), 0, time.Hour)
	require.NoError(t, err)
	out, err = runKeyed(t, c, wf, "after-bad", "bad")
	require.NoError(t, err)
	require.Equal(t, "run-2", out)

	for _, k := range []string{stale, bad} {
		st, err := tk.Latest(ctxT(t, 5*time.Second), k)
		require.NoError(t, err)
		e, err := state.DecodeTaskKeyEntry(st.Value)
		require.NoError(t, err)
		require.Equal(t, state.TaskKeyDone, e.State, k)
	}
}

// A step that runs longer than its key's lease keeps its claim: the holder
// renews it every third of the lease, so a waiter never takes it over and
// the step runs once.
func TestTaskKeyRunningClaimIsRenewed(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	var runs atomic.Int64
	gate := make(chan struct{})
	wf := keyed("long", func(ctx context.Context) (string, error) {
		n := runs.Add(1)
		select {
		case <-gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		return fmt.Sprintf("run-%d", n), nil
	}, WithKeyScope(ScopeWorkflow), WithKeyLease(time.Second))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	bkey, err := state.TaskKeyName(state.ScopeWorkflow, "long", "lookup", "k")
	require.NoError(t, err)

	holder, err := Start(ctxT(t, 10*time.Second), c, wf, "k", WithRunID("long-1"))
	require.NoError(t, err)
	var first uint64
	require.Eventually(t, func() bool {
		st, err := c.assets.TaskKeys.Latest(context.Background(), bkey)
		first = st.Rev
		return err == nil && st.Live
	}, 10*time.Second, 10*time.Millisecond, "claimed")
	waiter, err := Start(ctxT(t, 10*time.Second), c, wf, "k", WithRunID("long-2"))
	require.NoError(t, err)

	// Let the claim be renewed for more than a lease plus the waiter's
	// grace (about 3 renewals a second) while the waiter watches the key.
	renewals, changedHands := 0, ""
	require.Eventually(t, func() bool {
		si, err := c.assets.JS.Stream(context.Background(), "KV_"+jetstream.TaskKeysBucket)
		if err != nil || si.CachedInfo().State.Consumers < 1 {
			return false // the waiter is not watching yet
		}
		st, err := c.assets.TaskKeys.Latest(context.Background(), bkey)
		if err != nil || !st.Live {
			changedHands = "the claim disappeared"
			return true
		}
		if e, err := state.DecodeTaskKeyEntry(st.Value); err != nil || e.State != state.TaskKeyClaimed || e.Owner != "long-1.lookup.0" {
			changedHands = fmt.Sprintf("%+v %v", e, err)
			return true
		}
		if st.Rev != first {
			renewals++
			first = st.Rev
		}
		return renewals >= 8
	}, 20*time.Second, 20*time.Millisecond)
	require.Empty(t, changedHands, "the running step's claim changed hands")
	close(gate)

	for _, h := range []*Handle[string]{holder, waiter} {
		out, err := h.Result(ctxT(t, 30*time.Second))
		require.NoError(t, err)
		require.Equal(t, "run-1", out)
	}
	require.EqualValues(t, 1, runs.Load())
	require.True(t, served(t, c, "long-2"))
}

// G7, G3: a run-scoped task key is private to one generation of a run. A
// run started again under its run ID (StartNew) is a new run: its step runs,
// whether the previous generation's result under the key was a success or
// a cached failure, and a reset of the run's key covers both generations.
func TestRunScopedTaskKeyIsPerGeneration(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := NewWorkflow("gen-keys", func(ctx *Context, mode string) (string, error) {
		return Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			if mode == "fail" {
				return "", Fatal(errors.New("declined"))
			}
			return "charged by " + info.StepID, nil
		}, WithTaskKey("charge", time.Hour), WithCachedFailures())
	}, WithDefaultConflictPolicy(ConflictPolicy{AfterCompleted: StartNew, AfterFailed: StartNew}))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	for _, first := range []string{"ok", "fail"} {
		id := "gk-" + first
		h, err := Start(ctx, c, wf, first, WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, h.Outcome)
		out, err := h.Result(ctx)
		if first == "fail" {
			require.ErrorIs(t, err, ErrRunFailed)
		} else {
			require.NoError(t, err)
			require.Equal(t, "charged by "+id+".charge.0", out)
		}

		again, err := Start(ctx, c, wf, "ok", WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, OutcomeRestarted, again.Outcome)
		out, err = again.Result(ctx)
		require.NoError(t, err, "generation 1 got generation 0's cached outcome")
		require.Equal(t, "charged by "+id+"/1.charge.0", out, "generation 1 must run its own step")
		require.Equal(t, 1, effects.get(id+".charge.0"))
		require.Equal(t, 1, effects.get(id+"/1.charge.0"))

		n, err := c.ResetTaskKey(ctx, "charge", ScopeRun, id)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the reset covers both generations' entries")
	}
}

// G7 after an unclean stop of the server: a key it removed (a result past
// its TTL, a reset) may come back with its last value and no TTL. A result
// present past its own ExpiresAt is as good as gone, and a reset is written
// over the key (not purged) for longer than the result it forgets would
// have lived, so that the result comes back, if at all, past its time.
func TestTaskKeyRevivedPastItsTimeIsGone(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	const ttl = 2 * time.Second
	var runs atomic.Int64
	wf := NewWorkflow("revived", func(ctx *Context, key string) (string, error) {
		return Step(ctx, "lookup", counted(&runs), WithTaskKey(key, ttl), WithKeyScope(ScopeWorkflow))
	})
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	bkey, err := state.TaskKeyName(state.ScopeWorkflow, "revived", "lookup", "k")
	require.NoError(t, err)
	latest := func() jetstream.KeyState {
		st, err := c.assets.TaskKeys.Latest(ctx, bkey)
		require.NoError(t, err)
		return st
	}
	// revive writes value back over the key's marker as the server does
	// after an unclean stop: the last value, never to expire (an hour).
	revive := func(value []byte) {
		require.Eventually(t, func() bool { return !latest().Live }, 30*time.Second, 20*time.Millisecond, "the key never went")
		_, err := c.assets.TaskKeys.Replace(ctx, bkey, value, latest().Rev, time.Hour)
		require.NoError(t, err)
	}

	out, err := runKeyed(t, c, wf, "rv-1", "k")
	require.NoError(t, err)
	require.Equal(t, "run-1", out)
	result := latest().Value
	revive(result)
	out, err = runKeyed(t, c, wf, "rv-2", "k")
	require.NoError(t, err)
	require.Equal(t, "run-2", out, "a result present past its ExpiresAt was served")
	require.False(t, served(t, c, "rv-2"))

	// Reset, then the result comes back once the reset entry has gone.
	result = latest().Value
	done, err := state.DecodeTaskKeyEntry(result)
	require.NoError(t, err)
	n, err := c.ResetTaskKey(ctx, "k", ScopeWorkflow, "revived")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	reset, err := state.DecodeTaskKeyEntry(latest().Value)
	require.NoError(t, err)
	require.Equal(t, state.TaskKeyReset, reset.State)
	require.False(t, reset.ExpiresAt.Before(done.ExpiresAt), "the reset entry ends before the result it forgets")
	n, err = c.ResetTaskKey(ctx, "k", ScopeWorkflow, "revived")
	require.NoError(t, err)
	require.Zero(t, n, "a reset key reset again")
	revive(result)
	out, err = runKeyed(t, c, wf, "rv-3", "k")
	require.NoError(t, err)
	require.Equal(t, "run-3", out, "a reset undone served the old result")
	require.EqualValues(t, 3, runs.Load())
}
