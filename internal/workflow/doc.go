// Package workflow executes runs. A run advances by tasks: the worker that
// receives a task replays the workflow body against the run's committed
// steps, runs the one step the task stands for, commits its result with
// create-if-absent, publishes the tasks of the steps the body started next
// (several when it started them without waiting: see Pending) and only
// then acknowledges its own. A committed step is never run again (its result is
// replayed), a step whose worker died before the commit runs again with the
// same step ID, and a late worker cannot overwrite a committed result.
//
// # The flow of one task
//
// Executor.Handle (executor.go) takes one task message through these stages,
// top to bottom:
//
//  1. Load the run. A step task carries the run record's fields; a start
//     task materialises the record if its publisher died before writing it.
//     A task that must not touch the run (a stale start after the run
//     expired, a start of another workflow under the run ID, a start task
//     of a run already ended or of another generation, a task of a run this
//     worker saw cancelled) is acknowledged and nothing else happens.
//  2. Replay (replay.go, future.go). The workflow body runs on a goroutine
//     of its own. Each step it starts (Context.Start, StartChild) gets its
//     ID in start order; each await (Context.Await, Result) looks its steps
//     up, in the history cache and then the steps bucket, and returns once
//     they are committed; an await that cannot return ends the replay.
//  3. Execute at most one step (step.go, child.go): the step the task
//     owns, that is its step ID, or the run's first step for a start task.
//     The run's record is read first (cancel.go): a run no longer running
//     starts no step. Its attempt
//     number is taken from the attempt record (beginAttempt), its task key
//     acquired if it has one, and its function called.
//  4. Commit: the step record is written with create-if-absent. A worker
//     that loses the race takes the committed record as the result. The
//     replay goes on with that result until the next uncommitted step.
//  5. Settle (settle.go) the message with the settlement the replay ended
//     on: dispatch (publish the next steps' tasks, then ack), retry (nak
//     with the backoff, or a timer for a long one, retry.go), release (nak
//     after ReleaseDelay; nothing was committed), drop (ack; the task is
//     not the one to run its step) or finish (record the run's end with
//     compare-and-set, then ack).
//
// A step call that cannot return its step's result in this task (the step
// belongs to another task, is to be retried, or the task is released)
// must not return to the workflow body. Every function below the Context
// returns such an outcome as a *settlement; Context.park is the one place
// that hands it to Handle and unwinds the body's goroutine with
// runtime.Goexit, running the body's deferred calls.
//
// # Repeat deliveries
//
// The broker delivers a task at least once: again after a worker crash, an
// expired AckWait, or a publish repeated outside its duplicate window. A
// repeat delivery of the same task gets:
//
//   - its step already committed: the step is not run again. The replay
//     returns the committed result and goes on to the next step, whose task
//     it publishes (absorbed by the broker when that task is still pending
//     or within its duplicate window, as every task's message ID is its step
//     ID), or to the end of the body, where finishing a run already ended
//     leaves it as it is.
//   - its step not committed: the step runs again under the same step ID
//     (pass it as the Idempotency-Key of external calls) as the next
//     attempt, counted in the step's attempt record, so a crash loop uses up
//     MaxAttempts and then fails the step without running it.
//   - a retry whose attempt already started, or a redispatched task while a
//     retry timer of its step waits: it is dropped, as the attempt belongs
//     to another task.
//   - a start task of a run that has ended or of another generation, or a
//     task of a run this worker saw cancelled: it is acknowledged, doing
//     nothing. (A step task carries the run as it was when it was
//     published, so it replays; its finish finds the run ended.)
//
// # Waits: sleeps, events and hooks
//
// A wait (wait.go, WaitSpec, Context.StartWait) is a step that runs no
// function: a sleep, a wait for an event by run ID and name (step
// <run>.event=<name>.<n>) or on a hook token (<run>.hook=<name>.<n>). In
// stage 3 its task stores what will end it and acknowledges: a deadline
// (a sleep's, a timeout's) as the wait's own task in a JetStream message
// schedule (Task.WakeAt; jetstream.ScheduleTask), a hook's token in the
// hooks bucket (HookTokens), and for a wait with no deadline a recheck
// timer due after WaitRecheck, so a waiting run always has a message that
// will advance it. The due task, forwarded into the task stream by the
// DueForwarder, commits the sleep's end or the timeout once its deadline
// has passed. An event is committed by a Sender (deliver.go) into the
// first wait step of its name without a record (or the hook's step), and
// the sender publishes the run's resume task (PublishResume). Every one of
// these writes is create-if-absent on the wait's step record: the first
// wins, a repeat of the same event is a duplicate, and a wait ends once.
package workflow
