package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A rolling deploy under load: three workers of build v1 are replaced one
// at a time by workers of build v2, whose code names the run's two steps
// differently, while a client outside the workers (its own connection, the
// NATS start protocol) keeps starting runs that sleep across the deploy.
//
// Pinned: no run moves across builds (every step of a run is committed by
// a worker of the build that started it), none is blocked, nothing runs
// twice; the last v1 worker, superseded, takes no new run and serves its
// own until they end.
//
// Patched (upgrade on replay): runs that passed the patch point under v1
// keep v1's steps on every replay, runs started under v2 take v2's;
// nothing runs twice. (A v2 run woken on a v1 worker meanwhile is blocked
// there, not run wrongly, and goes on on v2.)
func TestRollingDeployPinned(t *testing.T) {
	t.Parallel()
	testRollingDeploy(t, true)
}

func TestRollingDeployPatched(t *testing.T) {
	t.Parallel()
	testRollingDeploy(t, false)
}

// rollingFlow is the workflow of build v ("v1" or "v2"): charge, a nap,
// ship. v2 names them charge-v2 and ship-v2 (behind Patched, when not
// pinned).
func rollingFlow(v string, pinned bool, effects *counter) *Workflow[int, string] {
	effect := func(sctx context.Context) (string, error) {
		info, _ := StepDetailsFrom(sctx)
		effects.inc(info.StepID)
		return v, nil
	}
	var opts []WorkflowOption
	if pinned {
		opts = append(opts, WithVersioning(Pinned))
	} else if v == "v2" {
		opts = append(opts, WithPatch("v2-names"))
	}
	return NewWorkflow("roll", func(ctx *Context, in int) (string, error) {
		suffix := ""
		if v == "v2" && (pinned || Patched(ctx, "v2-names")) {
			suffix = "-v2"
		}
		if _, err := Step(ctx, "charge"+suffix, effect); err != nil {
			return "", err
		}
		if err := Sleep(ctx, "nap", time.Second); err != nil {
			return "", err
		}
		return Step(ctx, "ship"+suffix, effect)
	}, opts...)
}

func testRollingDeploy(t *testing.T, pinned bool) {
	env := newEnv(t, Topology{})
	effects := newCounter()
	ctx := ctxT(t, 3*time.Minute)
	start := func(build string) *Worker {
		cfg := WorkerConfig{Build: build, Concurrency: 8, AckWait: 2 * time.Second, LivenessTTL: time.Second,
			SweepInterval: 500 * time.Millisecond, StuckAfter: 6 * time.Second, blockRecheck: 500 * time.Millisecond, Topology: env.topo}
		return startWorker(t, env.conn(), cfg, rollingFlow(build, pinned, effects))
	}
	v1 := []*Worker{start("v1"), start("v1"), start("v1")}

	// The outside client: starts by request-reply, one every 20ms.
	c := env.client()
	var started []string
	var mu sync.Mutex
	var n atomic.Int64
	stop := churn(func(int) bool {
		id := fmt.Sprintf("r-%d", n.Add(1))
		_, err := c.StartByName(ctx, "roll", json.RawMessage(`1`), WithRunID(id))
		if err == nil {
			mu.Lock()
			started = append(started, id)
			mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
			return true
		}
	})
	// Between two replacements the client starts 25 more runs.
	settle := func() {
		from := n.Load()
		require.Eventually(t, func() bool { return n.Load() >= from+25 }, time.Minute, 5*time.Millisecond)
	}
	settle()
	var v2 []*Worker
	for i := range 3 {
		v2 = append(v2, start("v2"))
		if pinned && i == 2 {
			break // the last v1 worker serves its runs until they end
		}
		require.NoError(t, v1[i].Stop(ctxT(t, 30*time.Second)))
		settle()
	}
	settle()
	stop()
	if pinned {
		// Superseded, the last v1 worker started no new run: wait for its
		// runs, then stop it.
		v1Ended := func() bool {
			page, err := c.ListRuns(ctx, ListOptions{Workflow: "roll", Status: StatusRunning, Limit: MaxListLimit})
			if err != nil {
				return false
			}
			for _, r := range page.Runs {
				if r.Build == "v1" {
					return false
				}
			}
			return true
		}
		// Polled by hand: the diagnosis is taken at the deadline, not
		// (as an argument of require.Eventually would be) before the wait.
		for deadline := time.Now().Add(time.Minute); !v1Ended() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		require.True(t, v1Ended(), func() string {
			page, _ := c.ListRuns(ctx, ListOptions{Workflow: "roll", Status: StatusRunning, Limit: MaxListLimit})
			out := ""
			for _, r := range page.Runs {
				if r.Build != "v1" {
					continue
				}
				full, err := c.GetRun(ctx, r.RunID)
				steps, _ := c.Steps(ctx, r.RunID)
				lv, _, lerr := c.assets.Steps.Get(ctx, r.RunID+".lease")
				out += fmt.Sprintf("\n%s status=%s build=%s err=%v steps=%d lease=%s lerr=%v", r.RunID, full.Status, full.Build, err, len(steps), lv, lerr)
				for _, st := range steps {
					out += fmt.Sprintf(" [%s %s %s]", st.StepID, st.Build, st.Kind)
				}
			}
			for _, name := range []string{"jetflow_run_roll", "jetflow_due"} {
				for _, st := range []string{"JETFLOW_TASKS", "JETFLOW_TIMERS"} {
					if cons, err := c.assets.JS.Consumer(ctx, st, name); err == nil {
						info, _ := cons.Info(ctx)
						out += fmt.Sprintf("\nconsumer %s/%s: pending %d ackpending %d redelivered %d waiting %d", st, name, info.NumPending, info.NumAckPending, info.NumRedelivered, info.NumWaiting)
					}
				}
			}
			for i, w := range append(append([]*Worker{}, v1...), v2...) {
				out += fmt.Sprintf("\nworker %d %s %s", i, w.cfg.Name, w.cfg.Build)
			}
			return "v1's runs did not end" + out
		}())
		require.NoError(t, v1[2].Stop(ctxT(t, 30*time.Second)))
	}
	for _, w := range v2 {
		stopAtEnd(t, w, 30*time.Second)
	}

	builds := map[string]int{}
	for _, id := range started {
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
		builds[run.Build]++
		steps, err := c.Steps(ctx, id)
		require.NoError(t, err)
		names := []string{}
		for _, s := range steps {
			if s.Kind == "" {
				names = append(names, s.Name)
				if pinned {
					require.Equal(t, run.Build, s.Build, "%s: step %s committed by another build", id, s.StepID)
				}
			}
		}
		want := []string{"charge", "ship"}
		if run.Build == "v2" {
			want = []string{"charge-v2", "ship-v2"}
		}
		require.Equal(t, want, names, "%s (started by %s) took the other build's way", id, run.Build)
	}
	require.Greater(t, builds["v1"], 0, "no run started under v1: %v", builds)
	require.Greater(t, builds["v2"], 0, "no run started under v2: %v", builds)
	for step, k := range effects.snapshot() {
		require.Equal(t, 1, k, "step %s ran %d times", step, k)
		require.True(t, strings.HasPrefix(step, "r-"), step)
	}
	t.Logf("runs: %d (v1 %d, v2 %d)", len(started), builds["v1"], builds["v2"])
}
