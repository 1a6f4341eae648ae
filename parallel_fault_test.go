package jetflow

import (
	"context"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// effectReporter is the side effect of a step in the parallel and child
// fault workflows: it logs the step's ID and attempt in the external
// effects log (in process, or over HTTP from a worker process).
type effectReporter func(ctx context.Context, info StepDetails) error

// reportedStep is a step that reports its side effect, then returns
// value().
func reportedStep[T any](report effectReporter, value func() T) func(context.Context) (T, error) {
	return func(sctx context.Context) (T, error) {
		info, _ := StepDetailsFrom(sctx)
		if err := report(sctx, info); err != nil {
			var zero T
			return zero, err
		}
		return value(), nil
	}
}

// recordIn reports side effects into an in-process effects log.
func recordIn(effects *faultcheck.Effects) effectReporter {
	return func(_ context.Context, info StepDetails) error {
		effects.Record(info.StepID, info.Attempt)
		return nil
	}
}

// fanOutFault ("fanout") starts as many branches as its input with Go, all
// called "branch", awaits them all and returns the sum of their results
// (branch i returns i): n(n-1)/2.
func fanOutFault(report effectReporter) *Workflow[int, int] {
	return NewWorkflow("fanout", func(ctx *Context, n int) (int, error) {
		fs := make([]*Future[int], n)
		for i := range n {
			fs[i] = Go(ctx, "branch", reportedStep(report, func() int { return i }),
				WithBackoff(50*time.Millisecond, 100*time.Millisecond))
		}
		vs, err := GetAll(ctx, fs)
		if err != nil {
			return 0, err
		}
		sum := 0
		for _, v := range vs {
			sum += v
		}
		return sum, nil
	})
}

// kidFault ("kid") is the child workflow: steps "inc" and "double",
// returning (in+1)*2.
func kidFault(report effectReporter) *Workflow[int, int] {
	return NewWorkflow("kid", func(ctx *Context, in int) (int, error) {
		v, err := Step(ctx, "inc", reportedStep(report, func() int { return in + 1 }))
		if err != nil {
			return 0, err
		}
		return Step(ctx, "double", reportedStep(report, func() int { return v * 2 }))
	})
}

// parentFault ("parent") runs step "prep" (its input), starts two kid
// children with inputs prep and prep+1 in parallel, awaits both and
// returns their sum from step "sum": for input x, (x+1)*2 + (x+2)*2 = 4x+6. Its four
// committed steps are prep, kid.0, kid.1 and sum.
func parentFault(report effectReporter) *Workflow[int, int] {
	kid := kidFault(report)
	return NewWorkflow("parent", func(ctx *Context, in int) (int, error) {
		prep, err := Step(ctx, "prep", reportedStep(report, func() int { return in }))
		if err != nil {
			return 0, err
		}
		a, b := Child(ctx, kid, prep), Child(ctx, kid, prep+1)
		if err := AwaitAll(ctx, a, b); err != nil {
			return 0, err
		}
		ra, err := a.Get(ctx)
		if err != nil {
			return 0, err
		}
		rb, err := b.Get(ctx)
		if err != nil {
			return 0, err
		}
		return Step(ctx, "sum", reportedStep(report, func() int { return ra + rb }))
	})
}

// parentFaultSteps is how many steps a completed parentFault run commits;
// kidFaultSteps a kidFault run.
const (
	parentFaultSteps = 4
	kidFaultSteps    = 2
)

// A 1,000-branch fan-out (Go in a loop, AwaitAll) on one in-process worker
// completes with every branch committed once and its side effect logged
// once, at the committed attempt.
func TestParallelThousandBranchesInProcess(t *testing.T) {
	t.Parallel()
	const n = 1000
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	wf := fanOutFault(recordIn(effects))
	const ackWait = time.Second
	env.worker(WorkerConfig{AckWait: ackWait}, wf)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	began := time.Now()
	h, err := Start(ctxT(t, 10*time.Second), c, wf, n, WithRunID("fan-plain"))
	require.NoError(t, err)
	ledger := faultcheck.NewLedger()
	ledger.Accepted(h.RunID, h.Outcome == OutcomeCreated)
	out, err := h.Result(ctxT(t, 120*time.Second))
	require.NoError(t, err)
	took := time.Since(began)
	require.Equal(t, n*(n-1)/2, out)

	v := faultcheck.Check(ctxT(t, 30*time.Second), c.assets, ledger, effects, writes, n, ackWait)
	require.NoError(t, writes.Stop())
	t.Logf("%d branches in %s; %s", n, took.Round(time.Millisecond), v)
	require.True(t, v.OK(), v.String())
	require.Equal(t, 1, v.Completed)
	require.Equal(t, n, v.SideEffects, "no worker died: every branch ran once")
}

// A fan-out of 1,000 branches runs on three
// worker processes, two of which are SIGKILLed at random moments while
// branches run, each replaced by a new process; the third keeps serving.
// The run completes, and every branch's side effect was committed exactly
// once: a branch ran again only when its worker died before its commit,
// never after it, and no result was written twice.
func TestFaultParallelBranchesWorkerProcessesKilled(t *testing.T) {
	t.Parallel()
	// Full size in every run: about 30 s under make stress's CPU hog.
	const n = 1000
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	srv := httptest.NewServer(effects)
	t.Cleanup(srv.Close)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	startChild(t, env, "slow", srv.URL) // never killed
	wf := fanOutFault(nil)              // the definition to start by; the processes run it
	h, err := Start(ctxT(t, 10*time.Second), c, wf, n, WithRunID("fan-kill"))
	require.NoError(t, err)
	ledger := faultcheck.NewLedger()
	ledger.Accepted(h.RunID, h.Outcome == OutcomeCreated)
	require.Eventually(t, func() bool { return effects.Len() > 0 }, 30*childAckWait, childAckWait/20, "no branch ran")

	// Branches run: kill one of two more workers every half to one and a
	// quarter AckWait (a killed worker's branches wait one AckWait for
	// redelivery), until the run is final or for at most killFor, after
	// which the last workers finish it.
	began := time.Now()
	roll := rollWorkers(t, env, srv.URL, childAckWait/2, childAckWait, syscall.SIGKILL)
	killFor := 60 * childAckWait
	final := make(chan error, 1)
	go func() {
		_, err := c.WaitRun(ctxT(t, killFor), h.RunID)
		final <- err
	}()
	<-final
	kills := roll.stop()
	v := faultcheck.Check(ctxT(t, 120*time.Second), c.assets, ledger, effects, writes, n, childAckWait)
	require.NoError(t, writes.Stop())
	t.Logf("%d branches, %d worker kills over %s; %s", n, kills, time.Since(began).Round(time.Millisecond), v)
	require.Positive(t, kills, "no worker was killed while branches ran")
	require.True(t, v.OK(), v.String())
	require.Equal(t, 1, v.Completed)
	out, err := h.Result(ctxT(t, 5*time.Second))
	require.NoError(t, err)
	require.Equal(t, n*(n-1)/2, out)
}

// The worker process that runs a fan-out's start task is SIGKILLed right
// after it committed the first branch, which the start task runs itself
// after publishing the other branches' tasks (some of which the same
// process may have run meanwhile). The start task's redelivery, on a new
// process, finds the branch committed: the run completes with every branch
// run once.
func TestFaultFanOutStartTaskKilledAfterFirstBranch(t *testing.T) {
	t.Parallel()
	const n = 200
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	srv := httptest.NewServer(effects)
	t.Cleanup(srv.Close)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	crasher := startChild(t, env, "after-first-branch", srv.URL)
	h, err := Start(ctxT(t, 10*time.Second), c, fanOutFault(nil), n, WithRunID("fan-start"))
	require.NoError(t, err)
	waitKilled(t, crasher, 30*childAckWait)
	require.Equal(t, []int{1}, effects.Attempts("fan-start.branch.0"))

	startChild(t, env, "", srv.URL)
	out, err := h.Result(ctxT(t, 60*time.Second))
	require.NoError(t, err)
	require.Equal(t, n*(n-1)/2, out)
	ledger := faultcheck.NewLedger()
	ledger.Accepted(h.RunID, h.Outcome == OutcomeCreated)
	v := faultcheck.Check(ctxT(t, 30*time.Second), c.assets, ledger, effects, writes, n, childAckWait)
	require.NoError(t, writes.Stop())
	t.Logf("%s", v)
	require.True(t, v.OK(), v.String())
	require.Equal(t, 1, v.Completed)
	// A branch the killed process was running when it died ran again: a
	// rerun before its commit, which Check allows.
	require.Equal(t, n, v.SideEffects-v.Reruns, "every branch ran once, or again only before its commit")
}

// A parent's child step is executed by a worker process that is SIGKILLed
// right after the child run was admitted, before the parent's task is
// acknowledged. A new worker process redelivers the parent's task, which
// attaches to the child instead of starting another: each child step has
// exactly one child run, every step of parent and children ran once, and
// the parent completes with its children's outputs.
func TestFaultChildStartedOnceAcrossParentCrash(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	srv := httptest.NewServer(effects)
	t.Cleanup(srv.Close)
	c := env.client()
	writes, err := faultcheck.WatchWrites(ctxT(t, 5*time.Second), c.assets.Steps)
	require.NoError(t, err)

	crasher := startChild(t, env, "after-child-start", srv.URL)
	parent := parentFault(nil) // the definition to start by; the processes run it
	h, err := Start(ctxT(t, 10*time.Second), c, parent, 1, WithRunID("pc-1"))
	require.NoError(t, err)
	waitKilled(t, crasher, 30*childAckWait)

	// The crash left a child admitted and the parent's task unacknowledged.
	before, err := c.GetRun(ctxT(t, 5*time.Second), "pc-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, before.Status)
	require.NotEmpty(t, before.Children, "the worker died after a child was admitted")
	first, err := c.GetRun(ctxT(t, 5*time.Second), before.Children[0].RunID)
	require.NoError(t, err)
	require.Equal(t, "pc-1", first.Parent.RunID)
	require.False(t, first.Status.Terminal(), "no worker ran the child before the restart")

	startChild(t, env, "", srv.URL)
	out, err := h.Result(ctxT(t, 60*time.Second))
	require.NoError(t, err)
	require.Equal(t, 4+6, out) // kid(1) + kid(2)

	// One child run per child step, and no other run of the workflow.
	run, err := c.GetRun(ctxT(t, 5*time.Second), "pc-1")
	require.NoError(t, err)
	require.Len(t, run.Children, 2)
	kids, err := c.ListRuns(ctxT(t, 5*time.Second), ListOptions{Workflow: "kid"})
	require.NoError(t, err)
	require.Len(t, kids.Runs, 2, "exactly one child run per child step")
	linked := map[string]string{} // child run ID -> parent's step ID
	for _, l := range run.Children {
		linked[l.RunID] = l.StepID
	}
	kidLedger := faultcheck.NewLedger()
	var kidSteps []string
	for _, k := range kids.Runs {
		require.Equal(t, "pc-1", k.Parent.RunID)
		kidSteps = append(kidSteps, k.Parent.StepID)
		require.Equal(t, k.Parent.StepID, linked[k.RunID], "the parent links the child to its step")
		kidLedger.Expect(k.RunID)
		t.Logf("child %s: %d duplicate admissions absorbed", k.RunID, k.Duplicates)
	}
	require.ElementsMatch(t, []string{"pc-1.kid.0", "pc-1.kid.1"}, kidSteps)

	ledger := faultcheck.NewLedger()
	ledger.Accepted(h.RunID, h.Outcome == OutcomeCreated)
	pv := faultcheck.Check(ctxT(t, 30*time.Second), c.assets, ledger, effects, writes, parentFaultSteps, childAckWait)
	kv := faultcheck.Check(ctxT(t, 30*time.Second), c.assets, kidLedger, effects, nil, kidFaultSteps, childAckWait)
	require.NoError(t, writes.Stop())
	t.Logf("parent: %s; children: %s", pv, kv)
	for _, v := range []faultcheck.Verdict{pv, kv} {
		require.True(t, v.OK(), v.String())
		require.Equal(t, v.Runs, v.Completed)
		require.Equal(t, v.CommittedSteps-v.ChildSteps, v.SideEffects, "every step ran once")
	}
	require.Equal(t, 2, pv.ChildSteps)
}

// A parent run that waits in the task stream when its first worker starts
// gets its children started by that worker, which registers the child
// workflow: a worker does not refuse a child of a workflow it serves
// because its own announcement of the workflow (which follows its first
// fetches) is not written yet.
func TestChildStartedByAWorkerThatIsStillStarting(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := faultcheck.NewEffects()
	report := recordIn(effects)
	parent := parentFault(report)
	c := env.client()
	h, err := Start(ctxT(t, 10*time.Second), c, parent, 1, WithRunID("early-1"))
	require.NoError(t, err)
	env.worker(WorkerConfig{AckWait: time.Second}, parent, kidFault(report))
	out, err := h.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 4+6, out)
}
