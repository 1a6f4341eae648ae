package jetflowtest_test

import (
	"context"
	"testing"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/jetflowtest"
)

// A step of the crashed worker whose function ignores its cancelled
// context and calls its provider after the crash: a killed process would
// never have made that call, and Effects does not count it. The fresh
// worker's call is the step's one call.
func TestCallsOfACrashedWorkersStepAreNotCounted(t *testing.T) {
	t.Parallel()
	fx := jetflowtest.NewEffects()
	bRuns, crashed := make(chan struct{}), make(chan struct{})
	zombieDone := make(chan bool, 1)
	var env *jetflowtest.Env
	wf := jetflow.NewWorkflow("zombie", func(ctx *jetflow.Context, _ int) (int, error) {
		// a commits, and the worker is killed, only while b runs on it.
		a := jetflow.Go(ctx, "a", func(context.Context) (int, error) { <-bRuns; return 1, nil })
		b := jetflow.Go(ctx, "b", func(sctx context.Context) (int, error) {
			if d, _ := jetflow.StepDetailsFrom(sctx); d.Attempt == 1 {
				close(bRuns)
				<-crashed
				zombieDone <- fx.Apply(sctx)
			} else {
				fx.Apply(sctx)
			}
			return 2, nil
		})
		if err := jetflow.AwaitAll(ctx, a, b); err != nil {
			return 0, err
		}
		return 3, nil
	})
	env = jetflowtest.New(t, wf)
	env.CrashAfterCommit("a")
	h := jetflowtest.Start(env, wf, 0, jetflow.WithRunID("z-1"))
	env.AwaitCrashes(1)
	close(crashed)
	if took := <-zombieDone; took {
		t.Fatal("the killed worker's call took effect")
	}
	ctx, cancel := env.Background()
	defer cancel()
	if out, err := h.Result(ctx); err != nil || out != 3 {
		t.Fatalf("Result = %d, %v", out, err)
	}
	fx.RequireCalledOnce(t)
}
