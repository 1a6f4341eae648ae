package jetflow

import (
	"context"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// blockingWorkflow's single step signals when it starts and returns when
// release is closed or its context ends.
func blockingWorkflow(started chan<- StepDetails, release <-chan struct{}, effects *counter) *Workflow[int, string] {
	return NewWorkflow("blocking", func(ctx *Context, _ int) (string, error) {
		return Step(ctx, "slow", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			started <- info
			select {
			case <-release:
				return "done", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		}, WithBackoff(10*time.Millisecond, 10*time.Millisecond))
	})
}

// Stop lets a running step finish and commit before it returns: the run is
// complete afterwards without the step running again.
func TestStopFinishesInFlightStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	started := make(chan StepDetails, 4)
	release := make(chan struct{})
	effects := newCounter()
	wf := blockingWorkflow(started, release, effects)
	w := startWorker(t, env.conn(), WorkerConfig{Topology: env.topo}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("drain-1"))
	require.NoError(t, err)
	<-started
	require.NoError(t, w.Ready(ctxT(t, 5*time.Second)))

	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctxT(t, 20*time.Second)) }()
	// A draining worker is not ready, and says so at once while the drain
	// waits for the step (a readiness probe must not wait for it).
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return w.Ready(ctx) != nil
	}, 5*time.Second, 10*time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while a step was running", err)
	default:
	}
	close(release)
	require.NoError(t, <-stopped)

	run, err := c.GetRun(ctxT(t, 5*time.Second), "drain-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "the drained step committed and the run finished")
	out, err := h.Result(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.Equal(t, "done", out)
	require.Equal(t, 1, effects.get("drain-1.slow.0"))
}

// When the drain deadline passes, the running step is cancelled and its task
// released uncommitted; another worker runs it again with the same step ID.
func TestStopDeadlineReleasesStepToAnotherWorker(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	started := make(chan StepDetails, 4)
	release := make(chan struct{})
	effects := newCounter()
	wf := blockingWorkflow(started, release, effects)
	w := startWorker(t, env.conn(), WorkerConfig{Topology: env.topo}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("drain-2"))
	require.NoError(t, err)
	first := <-started

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = w.Stop(ctx)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "Stop: %v", err)
	steps, err := c.Steps(ctxT(t, 5*time.Second), "drain-2")
	require.NoError(t, err)
	require.Empty(t, steps, "a cancelled step must not be committed")

	close(release)
	env.worker(WorkerConfig{}, wf)
	second := <-started
	require.Equal(t, first.StepID, second.StepID)
	require.Greater(t, second.Attempt, first.Attempt)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "done", out)
	require.Equal(t, 2, effects.get("drain-2.slow.0"))
}

// A draining worker starts no further sequential step: the holder hands the
// run over at the next step boundary (Stop does not wait for the rest of
// the body), and another worker runs the next step, once.
func TestStopHandsTheRunOverAtAStepBoundary(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	ranB := map[string]*counter{"A": newCounter(), "B": newCounter()}
	seq := func(who string) *Workflow[int, string] {
		return NewWorkflow("drainseq", func(ctx *Context, _ int) (string, error) {
			if _, err := Step(ctx, "a", func(context.Context) (int, error) {
				select {
				case started <- struct{}{}:
				default:
				}
				<-release
				return 1, nil
			}); err != nil {
				return "", err
			}
			return Step(ctx, "b", func(sctx context.Context) (string, error) {
				info, _ := StepDetailsFrom(sctx)
				ranB[who].inc(info.StepID)
				return who, nil
			})
		})
	}
	a := startWorker(t, env.conn(), WorkerConfig{Topology: env.topo}, seq("A"))
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, seq("A"), 0, WithRunID("drain-seq"))
	require.NoError(t, err)
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(ctxT(t, 30*time.Second)) }()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return a.Ready(ctx) != nil
	}, 5*time.Second, 10*time.Millisecond, "the drain began")
	close(release) // step a commits while its worker drains
	require.NoError(t, <-stopped)

	b := startWorker(t, env.conn(), WorkerConfig{Topology: env.topo}, seq("B"))
	stopAtEnd(t, b, 10*time.Second)
	out, err := h.Result(ctxT(t, 20*time.Second))
	require.NoError(t, err)
	require.Equal(t, "B", out, "step b ran on the worker that took the run over")
	require.Equal(t, 0, ranB["A"].get("drain-seq.b.0"), "the draining worker started no further step")
	require.Equal(t, 1, ranB["B"].get("drain-seq.b.0"))
}

// Stop returns an error only when the drain did not finish. Here the
// server refuses the purge that withdraws the worker's liveness record
// (the bucket's roll-ups turned off by an operator's edit after the worker
// started; heartbeats, plain writes, still pass): the worker drains its
// running step, Stop returns nil, and the refusal is logged at warn, as
// the record expires by itself.
//
// NATS permissions cannot refuse only the purge: it is a publish to the
// record's subject, as every heartbeat is, and changing a user's
// permissions mid-test by a configuration reload races inside nats-server.
func TestStopWithRefusedLivenessPurgeIsClean(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	started := make(chan StepDetails, 4)
	release := make(chan struct{})
	effects := newCounter()
	wf := blockingWorkflow(started, release, effects)
	logs := &testenv.LogBuffer{}
	w := startWorker(t, env.conn(), WorkerConfig{LivenessTTL: time.Second, Logger: zerolog.New(logs).Level(zerolog.WarnLevel)}, wf)
	c := env.client()
	h, err := Start(ctxT(t, 5*time.Second), c, wf, 0, WithRunID("purge-refused-1"))
	require.NoError(t, err)
	<-started

	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	stream, err := js.Stream(ctxT(t, 5*time.Second), "KV_jetflow_workflows")
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	require.True(t, cfg.AllowRollup)
	cfg.SubjectDeleteMarkerTTL, cfg.AllowRollup = 0, false
	_, err = js.UpdateStream(ctxT(t, 5*time.Second), cfg)
	require.NoError(t, err)

	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctxT(t, 30*time.Second)) }()
	close(release)
	require.NoError(t, <-stopped, "the drain finished; only the liveness purge was refused")

	warned := levelLines(t, logs, "warn", "liveness records not withdrawn; they expire by themselves")
	require.Len(t, warned, 1, "the refused purge is logged: %s", logs.String())
	require.Contains(t, warned[0]["error"], "withdraw liveness live.blocking.")
	require.Contains(t, warned[0]["error"], "rollup not permitted")
	run, err := c.GetRun(ctxT(t, 5*time.Second), "purge-refused-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "the drained step committed and the run finished")
	out, err := h.Result(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.Equal(t, "done", out)
	require.Equal(t, 1, effects.get("purge-refused-1.slow.0"))
}
