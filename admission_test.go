package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
)

// G1, G2: 64 goroutines on two clients start one run ID at once. One run is
// created, every handle names it, exactly one says created and 63 say
// existing, and the run absorbed 63 duplicates. Its steps ran once.
func TestConcurrentStartsOfOneRunID(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("race", effects)
	env.worker(WorkerConfig{}, wf)
	clients := []*Client{env.client(), env.client()}

	const n = 64
	handles := make([]*Handle[int], n)
	errs := make([]error, n)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			handles[i], errs[i] = Start(ctxT(t, 20*time.Second), clients[i%2], wf, 1, WithRunID("order-42"))
		}()
	}
	close(ready)
	wg.Wait()

	created := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, "order-42", handles[i].RunID)
		if handles[i].Outcome == OutcomeCreated {
			created++
			require.Zero(t, handles[i].Duplicates)
		} else {
			require.Equal(t, OutcomeExisting, handles[i].Outcome)
			require.GreaterOrEqual(t, handles[i].Duplicates, int64(1))
		}
	}
	require.Equal(t, 1, created, "exactly one start creates the run")

	out, err := handles[0].Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, 4, out)
	run, err := clients[1].GetRun(ctxT(t, 5*time.Second), "order-42")
	require.NoError(t, err)
	require.Equal(t, int64(n-1), run.Duplicates)
	require.Equal(t, map[string]int{"order-42.a.0": 1, "order-42.b.0": 1, "order-42.c.0": 1}, effects.snapshot())
}

// G1: 1,000 distinct run IDs, a quarter of them started twice at once, from
// 16 starters: exactly 1,000 runs, 250 duplicates, and each step of each run
// ran exactly once.
func TestDistinctRunsWithDuplicates(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("bulk", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	const runs = 1000
	type start struct{ id string }
	work := make(chan start)
	var (
		mu      sync.Mutex
		created = map[string]int{}
		dups    = map[string]int{}
	)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				h, err := Start(ctxT(t, 30*time.Second), c, wf, 0, WithRunID(s.id))
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				if h.Outcome == OutcomeCreated {
					created[s.id]++
				} else {
					dups[s.id]++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range runs {
		id := fmt.Sprintf("bulk-%d", i)
		work <- start{id}
		if i%4 == 0 {
			work <- start{id} // the duplicate, racing the first on another starter
		}
	}
	close(work)
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	require.Len(t, created, runs)
	for id, n := range created {
		require.Equal(t, 1, n, "run %s created %d times", id, n)
	}
	require.Len(t, dups, runs/4)

	// Every run completes and every step ran once.
	for i := range runs {
		id := fmt.Sprintf("bulk-%d", i)
		run, err := c.WaitRun(ctxT(t, 60*time.Second), id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, id)
	}
	snap := effects.snapshot()
	require.Len(t, snap, 3*runs)
	for stepID, n := range snap {
		require.Equal(t, 1, n, "step %s ran %d times", stepID, n)
	}
}

// G1, G25: a duplicate start after the broker's duplicate window has
// passed is still absorbed: the run bucket is the authority, and a
// duplicate publishes no start task (every duplicate is counted as stopped
// by the run record, none by the broker).
func TestDuplicateAfterBrokerWindow(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: 300 * time.Millisecond})
	effects := newCounter()
	wf := threeSteps("window", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	h, err := Start(ctxT(t, 10*time.Second), c, wf, 1, WithRunID("evt-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	awaitWindowPassed(t, c)
	tap := newTaskTap(t, env)

	// Every repeat is absorbed; the metrics say which layer stopped it.
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	admit := dedupe.New(c.assets, dedupe.Config{Metrics: m.internal()})
	const repeats = 5
	for range repeats {
		res, err := admit.Admit(context.Background(), dedupe.Request{RunID: "evt-1", Workflow: "window", Input: json.RawMessage(`1`)})
		require.NoError(t, err)
		require.Equal(t, dedupe.Existing, res.Outcome, "every repeated start is absorbed")
	}
	fams, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	require.Zero(t, sample(byName, "jetflow_duplicates_suppressed_total", map[string]string{"layer": "broker"}))
	require.Equal(t, float64(repeats), sample(byName, "jetflow_duplicates_suppressed_total", map[string]string{"layer": "kv"}))
	require.Equal(t, float64(repeats), sample(byName, "jetflow_starts_total", map[string]string{"outcome": "existing", "state": "completed"}))
	h2, err := Start(ctxT(t, 10*time.Second), c, wf, 1, WithRunID("evt-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, h2.Outcome)
	require.Equal(t, StatusCompleted, h2.Status)

	require.Empty(t, subjects(tap.Seen(c.nc)), "a duplicate published a start task")
	require.Equal(t, map[string]int{"evt-1.a.0": 1, "evt-1.b.0": 1, "evt-1.c.0": 1}, effects.snapshot())
}

// G1: a duplicate start after the NATS server restarted (its duplicate
// window, kept in memory, is gone) is still absorbed.
func TestDuplicateAfterServerRestart(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("restart", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()

	h, err := Start(ctxT(t, 10*time.Second), c, wf, 1, WithRunID("evt-7"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	_, err = h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)

	require.NoError(t, env.srv.Restart())
	c2 := env.client() // a fresh process's client
	h2, err := Start(ctxT(t, 20*time.Second), c2, wf, 1, WithRunID("evt-7"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, h2.Outcome)
	require.Equal(t, StatusCompleted, h2.Status)
	require.Equal(t, int64(1), h2.Duplicates)
	out, err := h2.Result(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 4, out)

	waitTasksDrained(t, c2)
	require.Equal(t, map[string]int{"evt-7.a.0": 1, "evt-7.b.0": 1, "evt-7.c.0": 1}, effects.snapshot())
}

// waitTasksDrained waits until every task in the stream was acknowledged.
func waitTasksDrained(t *testing.T, c *Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := c.assets.Tasks.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	}, 20*time.Second, 20*time.Millisecond)
}

// G8: a start whose publisher died after the start task was stored but
// before the run record was written is not lost: the worker that receives
// the task creates the record and runs the run.
func TestStartTaskWithoutRecordStillRuns(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("orphan", effects)
	c := env.client()
	task, err := json.Marshal(map[string]any{"v": 1, "run_id": "orphan-1", "workflow": "orphan", "input": 2, "token": "died"})
	require.NoError(t, err)
	_, err = jetstream.PublishTask(ctxT(t, 5*time.Second), c.assets.JS, jetstream.RunSubject("orphan", "orphan-1"), "orphan-1", task)
	require.NoError(t, err)
	_, err = c.GetRun(ctxT(t, 5*time.Second), "orphan-1")
	require.ErrorIs(t, err, ErrRunNotFound)

	env.worker(WorkerConfig{}, wf)
	require.Eventually(t, func() bool {
		run, err := c.GetRun(context.Background(), "orphan-1")
		return err == nil && run.Status == StatusCompleted
	}, 20*time.Second, 20*time.Millisecond)
	run, err := c.GetRun(ctxT(t, 5*time.Second), "orphan-1")
	require.NoError(t, err)
	require.JSONEq(t, `5`, string(run.Output))
	h, err := Start(ctxT(t, 5*time.Second), c, wf, 2, WithRunID("orphan-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, h.Outcome)
	require.Len(t, effects.snapshot(), 3)
}
