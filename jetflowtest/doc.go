// Package jetflowtest lets you prove, in your own tests, that your
// workflows never do anything twice: that a charge is made once through
// worker crashes, that a retried start lands on the same run, that a
// changed workflow still replays the runs in flight.
//
// Everything runs against a real embedded NATS server with JetStream, the
// engine your deployment runs, not a simulation of it:
//
//	func TestOrder(t *testing.T) {
//		env := jetflowtest.New(t, orderWorkflow)            // NATS, a worker, a client
//		env.CrashAfterCommit("charge")                      // kill the worker at the worst moment
//		out, err := jetflowtest.Run(env, orderWorkflow, in, jetflow.WithRunID("order-42"))
//		...
//		charge, _ := env.Inspect("order-42").Step("charge") // step ID, attempts, result
//	}
//
// What the kit gives:
//
//   - New: an Env in one line. Its server stores in t.TempDir(); its
//     worker and client are stopped when the test ends, and the test fails
//     if the worker does not drain or a connection is left open. Main adds
//     a goroutine-leak check to a package's TestMain.
//   - Run, Start, Env.Wait, Env.Inspect: run to completion with typed
//     results, and read a run as stored — its steps with their IDs,
//     attempts and results, the duplicate-start audit, sleeps, timers and
//     events.
//   - Env.CrashAfterCommit, Env.CrashDuringStep: a simulated SIGKILL of the
//     worker at an exact point of a named step, a fresh worker taking over.
//     Effects counts the calls your steps make per Idempotency-Key, as a
//     payment API that deduplicates by key sees them.
//   - Stub, StubIn: replace a step's function (the payment call) without
//     touching the workflow body.
//   - Env.Advance: move the Env's time forward, so a workflow that sleeps
//     three days completes in milliseconds.
//   - Replay: run a recorded history against changed workflow code and
//     report where the step sequence would diverge.
//
// docs/testing.md in the repository walks through a first test;
// examples/ordertests is a module of its own that tests the example order
// workflow with each of these.
package jetflowtest
