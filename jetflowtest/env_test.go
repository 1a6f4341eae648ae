package jetflowtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/jetflowtest"
)

func TestMain(m *testing.M) { jetflowtest.Main(m) }

// order reserves, charges and ships; every step records its call in fx.
func order(fx *jetflowtest.Effects) *jetflow.Workflow[int, string] {
	return jetflow.NewWorkflow("order", func(ctx *jetflow.Context, amount int) (string, error) {
		for _, name := range []string{"reserve", "charge", "ship"} {
			if _, err := jetflow.Step(ctx, name, func(sctx context.Context) (string, error) {
				fx.Apply(sctx)
				d, _ := jetflow.StepDetailsFrom(sctx)
				return d.StepID, nil
			}); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("charged %d", amount), nil
	})
}

func TestRunCompletesAndIsInspected(t *testing.T) {
	t.Parallel()
	fx := jetflowtest.NewEffects()
	env := jetflowtest.New(t, order(fx))
	out, err := jetflowtest.Run(env, order(fx), 42, jetflow.WithRunID("order-1"))
	if err != nil || out != "charged 42" {
		t.Fatalf("Run = %q, %v; want charged 42", out, err)
	}
	// A duplicate start lands on the same run.
	if out, err := jetflowtest.Run(env, order(fx), 42, jetflow.WithRunID("order-1")); err != nil || out != "charged 42" {
		t.Fatalf("duplicate Run = %q, %v", out, err)
	}
	r := env.Inspect("order-1")
	if got := r.StepNames(); fmt.Sprint(got) != "[reserve charge ship]" {
		t.Fatalf("steps %v", got)
	}
	if r.Run.Status != jetflow.StatusCompleted || r.Run.Duplicates != 1 {
		t.Fatalf("run %+v: want completed with 1 duplicate", r.Run)
	}
	charge, _ := r.Step("charge")
	if charge.StepID != "order-1.charge.0" || charge.Attempt != 1 {
		t.Fatalf("charge %+v", charge)
	}
	fx.RequireCalledOnce(t)
}

func TestCrashAfterCommitDoesNotRunTheStepAgain(t *testing.T) {
	t.Parallel()
	fx := jetflowtest.NewEffects()
	env := jetflowtest.New(t, order(fx))
	env.CrashAfterCommit("charge")
	if _, err := jetflowtest.Run(env, order(fx), 7, jetflow.WithRunID("order-2")); err != nil {
		t.Fatal(err)
	}
	if env.Crashes() != 1 {
		t.Fatalf("crashes = %d, want 1", env.Crashes())
	}
	fx.RequireCalledOnce(t)
}

func TestCrashDuringStepRunsItAgainUnderTheSameKey(t *testing.T) {
	t.Parallel()
	fx := jetflowtest.NewEffects()
	env := jetflowtest.New(t, order(fx))
	env.CrashDuringStep("charge")
	if _, err := jetflowtest.Run(env, order(fx), 7, jetflow.WithRunID("order-3")); err != nil {
		t.Fatal(err)
	}
	if got := fx.Calls("order-3.charge.0"); got != 2 {
		t.Fatalf("charge called %d times, want 2 (one before the crash, one after)", got)
	}
	if got := fx.Repeated(); fmt.Sprint(got) != "[order-3.charge.0]" {
		t.Fatalf("repeated %v", got)
	}
	fx.RequireApplied(t, "order-3.reserve.0", "order-3.charge.0", "order-3.ship.0")
	charge, _ := env.Inspect("order-3").Step("charge")
	if charge.Attempt != 2 {
		t.Fatalf("charge committed at attempt %d, want 2", charge.Attempt)
	}
}

func TestStubReplacesAStep(t *testing.T) {
	t.Parallel()
	fx := jetflowtest.NewEffects()
	env := jetflowtest.New(t, order(fx))
	jetflowtest.Stub(env, "charge", func(context.Context) (string, error) {
		return "", jetflow.Fatal(errors.New("card declined"))
	})
	_, err := jetflowtest.Run(env, order(fx), 7, jetflow.WithRunID("order-4"))
	var re *jetflow.RunError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a run error", err)
	}
	if got := fx.Keys(); fmt.Sprint(got) != "[order-4.reserve.0]" {
		t.Fatalf("effects %v: the stub must have replaced charge, and ship must not run", got)
	}
}
