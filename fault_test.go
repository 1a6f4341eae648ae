package jetflow

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// faultScale is the load of a fault scenario: the reduced size runs in CI,
// JETFLOW_FAULT_FULL=1 runs the full one.
func faultScale(reduced, full int) int {
	if os.Getenv("JETFLOW_FAULT_FULL") != "" {
		return full
	}
	return reduced
}

// load starts runs IDs prefix-0..n-1 from a few producers at a steady pace,
// 30% of them twice (the duplicate a few starts later). A start that fails
// (the broker is restarting, say) is retried with the same run ID, as a
// real producer would. It records every answer in the ledger.
func load(t *testing.T, c *Client, wf *Workflow[int, int], prefix string, n int, every time.Duration, l *faultcheck.Ledger) {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		ids = append(ids, id)
		if i%10 < 3 && i > 2 {
			ids = append(ids, fmt.Sprintf("%s-%d", prefix, i-2)) // a duplicate
		}
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				deadline := time.Now().Add(60 * time.Second)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					h, err := Start(ctx, c, wf, 0, WithRunID(id))
					cancel()
					if err == nil {
						l.Accepted(id, h.Outcome == OutcomeCreated)
						break
					}
					l.Failed()
					if time.Now().After(deadline) {
						t.Errorf("start %s kept failing: %v", id, err)
						break
					}
				}
			}
		}()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for _, id := range ids {
		<-tick.C
		work <- id
	}
	close(work)
	wg.Wait()
}

// Worker processes are SIGKILLed at random points while runs are started at
// a steady pace (30% duplicates). Every accepted start has one run, every
// run completes, every committed step's side effect happened once at the
// committed attempt, none ran after its commit, no result was rewritten.
func TestFaultWorkerProcessesKilledUnderLoad(t *testing.T) {
	t.Parallel()
	// Each victim is killed first and replaced after: a crash, not a
	// handover.
	v, kills := underRollingWorkers(t, syscall.SIGKILL, 150*time.Millisecond, childAckWait, "kill", faultScale(200, 3000))
	t.Logf("worker kills=%d; %s", kills, v)
	require.True(t, v.OK(), v.String())
	require.Equal(t, v.Runs, v.Completed)
	require.Positive(t, v.Duplicates)
}

// The whole single-node embedded server (the default deployment) is
// restarted while runs are in flight. Producers retry the starts that fail
// during the restart; workers reconnect. Nothing is lost or doubled.
func TestFaultEmbeddedServerRestartedMidRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	wf := NewWorkflow("restartable", func(ctx *Context, in int) (int, error) {
		sum := in
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				effects.Record(info.StepID, info.Attempt)
				return sum + 1, nil
			}, WithBackoff(50*time.Millisecond, 200*time.Millisecond))
			if err != nil {
				return 0, err
			}
			sum = v
		}
		return sum, nil
	})
	env.worker(WorkerConfig{AckWait: time.Second}, wf)
	c := env.client()

	ledger := faultcheck.NewLedger()
	n := faultScale(150, 2000)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		load(t, c, wf, "rs", n, 5*time.Millisecond, ledger)
	}()
	// Restart once a third of the load is in.
	require.Eventually(t, func() bool { return ledger.Len() > n/3 }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, env.srv.Restart())
	restarted := time.Now()
	<-loaded
	t.Logf("load done %s after the restart", time.Since(restarted))

	v := faultcheck.Check(ctxT(t, 90*time.Second), c.assets, ledger, effects, nil, 3, time.Second)
	t.Logf("server restarted once, all final %s after it; %s", time.Since(restarted), v)
	require.True(t, v.OK(), v.String())
	require.Equal(t, v.Runs, v.Completed)
}

// Worker processes are stopped with SIGTERM, one at a time at random
// moments, while runs are started at a steady pace (30% duplicates); each
// is replaced by a new process. A worker that gets SIGTERM stops fetching,
// finishes its running steps, commits and acks them, and exits 0 within its
// drain deadline. Nothing is lost, and since no process dies mid-step no
// step runs twice: every side effect is a committed step's only attempt.
func TestDrainWorkerProcessesSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	// The replacement starts first, as in a rolling update, so that one
	// worker is always serving; then the victim drains. No process dies,
	// so AckWait never passes for a task: it is long enough that a
	// process the loaded machine stalls for a moment does not lose its
	// task either (a stall past AckWait is a crash as far as the broker
	// can tell, and its step may run again: not what this test is about).
	v, drains := underRollingWorkers(t, syscall.SIGTERM, 100*time.Millisecond, 10*childAckWait, "drain", faultScale(500, 3000))
	t.Logf("worker drains=%d; %s", drains, v)
	require.Positive(t, drains)
	require.True(t, v.OK(), v.String())
	require.Equal(t, v.Runs, v.Completed)
	require.Equal(t, v.CommittedSteps, v.SideEffects, "a drained worker's steps must not run again elsewhere")
	require.Zero(t, v.Reruns)
	require.Positive(t, v.Duplicates)
}

// underRollingWorkers starts n runs (prefix-0..n-1, 30% duplicates) of the
// crash workflow while rollWorkers replaces worker processes (AckWait
// ackWait) with sig every interval or so, then checks every run and step.
// It returns the verdict and how many workers were replaced.
func underRollingWorkers(t *testing.T, sig syscall.Signal, interval, ackWait time.Duration, prefix string, n int) (faultcheck.Verdict, int) {
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	srv := httptest.NewServer(effects)
	t.Cleanup(srv.Close)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	roll := rollWorkers(t, env, srv.URL, interval, ackWait, sig)
	ledger := faultcheck.NewLedger()
	load(t, c, crashWorkflow(srv.URL, nil), prefix, n, 10*time.Millisecond, ledger)
	replaced := roll.stop()

	v := faultcheck.Check(ctxT(t, 90*time.Second), c.assets, ledger, effects, writes, 3, ackWait)
	require.NoError(t, writes.Stop())
	return v, replaced
}

// roller replaces the two child workers of a test one at a time.
type roller struct {
	halt chan struct{}
	done chan struct{}
	n    int // replacements made; read after done
}

// rollWorkers starts two child workers ("slow" steps) and, every interval
// plus up to 1.5 intervals at random, replaces one of them by sending it
// sig. With SIGKILL the victim dies first and its replacement starts after
// (a crash). With any other signal the replacement starts first and the
// victim gets sig once the replacement's worker serves, as in a rolling
// update; the victim must then drain and exit 0. stop ends the
// rolling and returns how many workers were replaced.
func rollWorkers(t *testing.T, env *testEnv, effectsURL string, interval, ackWait time.Duration, sig syscall.Signal) *roller {
	return rollWorkersAs(t, env, "slow", effectsURL, interval, ackWait, sig)
}

// rollWorkersAs is rollWorkers with child workers of another mode (the
// child's crash mode: what it serves and how it fails).
func rollWorkersAs(t *testing.T, env *testEnv, mode, effectsURL string, interval, ackWait time.Duration, sig syscall.Signal) *roller {
	r := &roller{halt: make(chan struct{}), done: make(chan struct{})}
	var children []*exec.Cmd
	for range 2 {
		c, err := spawnChildAckWait(t, env, mode, effectsURL, ackWait)
		require.NoError(t, err)
		children = append(children, c)
	}
	if sig != syscall.SIGKILL {
		for _, c := range children {
			require.NoError(t, waitReady(c, 30*time.Second))
		}
	}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.halt:
				return
			case <-time.After(interval + time.Duration(rand.Int64N(int64(interval)*3/2))):
			}
			i := rand.IntN(len(children))
			victim := children[i]
			if sig == syscall.SIGKILL {
				_ = victim.Process.Signal(sig)
				_ = victim.Wait()
			}
			next, err := spawnChildAckWait(t, env, mode, effectsURL, ackWait)
			if err != nil {
				t.Errorf("start worker process: %v", err)
				return
			}
			children[i] = next
			if sig != syscall.SIGKILL {
				// A handover: the victim goes once its replacement serves.
				if err := waitReady(next, 30*time.Second); err != nil {
					t.Errorf("replacement worker: %v", err)
					return
				}
				_ = victim.Process.Signal(sig)
				if err := victim.Wait(); err != nil {
					t.Errorf("worker process after %v: %v (want a clean drain, exit 0)", sig, err)
				}
			}
			r.n++
		}
	}()
	return r
}

func (r *roller) stop() int {
	close(r.halt)
	<-r.done
	return r.n
}
