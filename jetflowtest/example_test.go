package jetflowtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/jetflowtest"
)

// payment is the workflow of the examples: it charges once, through
// charges, an external system that deduplicates by Idempotency-Key.
func payment(charges *jetflowtest.Effects) *jetflow.Workflow[int, string] {
	return jetflow.NewWorkflow("payment", func(ctx *jetflow.Context, cents int) (string, error) {
		return jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			charges.Apply(sctx) // a real step passes its step ID as the Idempotency-Key
			return fmt.Sprintf("charged %d cents", cents), nil
		})
	})
}

// A test starts an Env with its workflows, runs one to completion and
// reads what the run stored. In a test, pass the test's t.
func Example() {
	t := newExampleT()
	defer t.finish()

	charges := jetflowtest.NewEffects()
	env := jetflowtest.New(t, payment(charges))
	out, err := jetflowtest.Run(env, payment(charges), 4200, jetflow.WithRunID("pay-1"))
	fmt.Println(out, err)

	r := env.Inspect("pay-1")
	fmt.Println(r.Run.Status, r.StepNames())
	fmt.Println(charges.Keys())
	// Output:
	// charged 4200 cents <nil>
	// completed [charge]
	// [pay-1.charge.0]
}

// The worker dies after the charge is committed and before its task is
// acknowledged; the fresh worker that takes over does not charge again.
func ExampleEnv_CrashAfterCommit() {
	t := newExampleT()
	defer t.finish()

	charges := jetflowtest.NewEffects()
	env := jetflowtest.New(t, payment(charges))
	env.CrashAfterCommit("charge")
	out, err := jetflowtest.Run(env, payment(charges), 4200, jetflow.WithRunID("pay-2"))
	fmt.Println(out, err)
	fmt.Println("crashes:", env.Crashes(), "charge calls:", charges.Calls("pay-2.charge.0"))
	// Output:
	// charged 4200 cents <nil>
	// crashes: 1 charge calls: 1
}

// The worker dies in the middle of the charge, after the external system
// took it: the fresh worker calls again with the same Idempotency-Key, and
// the system's deduplication keeps it one charge.
func ExampleEnv_CrashDuringStep() {
	t := newExampleT()
	defer t.finish()

	charges := jetflowtest.NewEffects()
	env := jetflowtest.New(t, payment(charges))
	env.CrashDuringStep("charge")
	_, err := jetflowtest.Run(env, payment(charges), 4200, jetflow.WithRunID("pay-3"))
	fmt.Println(err)
	fmt.Println("calls:", charges.Calls("pay-3.charge.0"), "keys:", charges.Keys())
	// Output:
	// <nil>
	// calls: 2 keys: [pay-3.charge.0]
}

// A stub replaces the charge step's function without touching the
// workflow body: here the card is declined.
func ExampleStub() {
	t := newExampleT()
	defer t.finish()

	charges := jetflowtest.NewEffects()
	env := jetflowtest.New(t, payment(charges))
	jetflowtest.Stub(env, "charge", func(context.Context) (string, error) {
		return "", jetflow.Fatal(errors.New("card declined"))
	})
	_, err := jetflowtest.Run(env, payment(charges), 4200, jetflow.WithRunID("pay-4"))
	var re *jetflow.RunError
	fmt.Println(errors.As(err, &re), re.Kind, len(charges.Keys()))
	// Output:
	// true step 0
}

// exampleT stands in for the *testing.T of a test in the examples: it
// fails by panicking, prints errors (so an example's output differs) and
// runs the cleanups at finish.
type exampleT struct {
	dirs     []string
	cleanups []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                   {}
func (t *exampleT) Name() string              { return "example" }
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Log(...any)                {}
func (t *exampleT) Logf(string, ...any)       {}
func (t *exampleT) Errorf(f string, a ...any) { fmt.Printf("error: "+f+"\n", a...) }
func (t *exampleT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (t *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "jetflowtest-example-")
	if err != nil {
		panic(err)
	}
	t.dirs = append(t.dirs, dir)
	return dir
}

func (t *exampleT) finish() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	for _, dir := range t.dirs {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Println("error:", err)
		}
	}
}
