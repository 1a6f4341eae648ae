// Package workflow executes runs. One delivery at a time executes a run's
// body: the holder of the run's lease. It runs the body's sequential steps
// inline, one after the other, committing each result before it goes on;
// it hands the steps the body starts beside others to branch tasks; it
// begins the waits and children the body starts; and when the body awaits
// something not committed yet it parks the run and acknowledges its task.
// Whatever commits the awaited step (a branch, an event, a child's end, a
// due timer) wakes the run, and the next holder replays the body against
// the committed records, which return their results without running again.
//
// A committed step is never run again (its result is replayed), a step
// whose worker died before the commit runs again with the same step ID,
// and a holder that lost its lease cannot commit anything.
//
// # Tasks
//
// A run has two kinds of task messages in the task stream:
//
//   - run tasks, on jetflow.run.<workflow>.<run identity>: the run's start
//     and every wake of it (wake.go). The stream keeps at most one per
//     subject, so at most one run task of a run is pending at a time; a
//     wake published while one is pending is absorbed by it, and that
//     task's holder sees the commit that woke it (or parks and looks
//     again, see below).
//   - branch tasks, on jetflow.branch.<workflow>.<step ID>: one step each,
//     published by the holder under the step ID as message ID.
//
// Timers (a sleep's end, a wait's timeout, a retry's backoff, a wait's
// recheck) are JetStream message schedules on jetflow.sched.*, due as
// jetflow.fire.* messages that the DueForwarder (timers.go) publishes as
// wakes or branch tasks.
//
// # The run task: holding the lease
//
// Executor.Runs (executor.go) hands each run task to handleRun (holder.go):
//
//  1. Load the run (loadRun). A start task materialises the record if its
//     publisher died before writing it (a producer of the previous version
//     published first), and reads the run's lease key beside it. A task
//     that must not touch the run (a stale start, a run ended, another
//     generation, a run an earlier version's workers execute) is
//     acknowledged; so is a stray start task, stored after the run was
//     parked, without a replay (startrole.go, startRole).
//  2. Take the lease (hold). The lease is the record <identity>.lease in
//     the steps bucket (state.Lease); every commit of a holder is fenced by
//     it: a write that expects the lease key still at the revision the
//     holder took it at (lease.go, KV.PutFenced). The first delivery of the
//     run's own start task, no lease record written, holds the lease
//     without reading or writing anything more. The
//     first delivery of a wake, finding the lease parked or released by
//     another message's holder, holds it at that revision without a write;
//     so does the delivery right after one that handed its task back
//     unstarted (no later one: two holders must never share a revision,
//     since a commit does not move the lease). The delivery right after
//     one that parked the run takes it over with a write, but as a clean
//     holder: nothing was started past the await.
//     A redelivery, or a delivery that finds the lease held by another,
//     waits until that holder parks, releases, or stops renewing for a whole
//     AckWait, then takes the lease over with compare-and-set: from then
//     on the stalled holder's commits are refused. The history a holder
//     decides on is a snapshot that holds the lease at its revision
//     (history.go, readFenced), so it holds every commit fenced before.
//  3. Replay (context.go, future.go) the body against the history. Each
//     await (advance.go) classifies the steps started since the last one:
//     the one step function it waits for, started alone, runs inline
//     (inline.go); every other step function is a branch; waits (wait.go)
//     and children (child.go) are begun by the holder. It then decides the
//     await on the records, or parks.
//  4. Settle (runsettle.go): finish (record the run's end with
//     compare-and-set, tell the parent, ack), park (write the lease parked
//     at the await's epoch, read what it waits for once more, then ack and
//     confirm, or nak at once if it is committed now: a commit whose wake
//     this task absorbed is not lost, even if the holder dies in between),
//     release (write the lease released, nak after ReleaseDelay) or lost
//     (the lease was taken over: leave the message to its new holder).
//
// A holder proves its lease by its delivery and by every fenced write the
// broker accepts; a proof is good for two thirds of an AckWait. It renews
// the lease at every heartbeat of its message (lease.beat), and before it
// starts a step with an older proof (lease.live). A holder that stalls past
// its lease finds its next write refused (errLeaseLost) and its context
// cancelled; it starts nothing more.
//
// A step call that cannot return its step's result in this task must not
// return to the workflow body. Every function below the Context returns
// such an outcome as a *settlement; Context.park is the one place that
// hands it to the handler and unwinds the body's goroutine with
// runtime.Goexit, running the body's deferred calls.
//
// # Inline steps and their attempts
//
// An inline step (inline.go, step.go) takes its attempt number from the
// history (a holder that took the run over reads the step's attempt log:
// the holder before it may have started it), runs its function and commits
// the record fenced by the lease. A failed attempt is retried in place when
// its backoff is short (up to two seconds), each attempt logged before it
// starts; a longer backoff is stored as a run timer with the attempt log's
// NotBefore, and the run parks until it is due.
//
// # Branch tasks
//
// handleBranch (branch.go) reads, side by side, the run's record, its own
// step's and the lease's records, and the run's history up to the task's
// Upto (the revision the holder's history reached when it published the
// branch). A run that ended or was cancelled starts nothing; a step already
// committed is done. Otherwise it replays the body as far as its own step's
// call, takes the attempt number (beginAttempt), runs the function,
// commits with create-if-absent and wakes the run. It never continues the
// body. A branch that fails is retried by a nak with the backoff, or by a
// branch timer for a long one.
//
// # Repeat deliveries
//
// The broker delivers a task at least once: again after a worker crash, an
// expired AckWait, or a publish repeated outside its duplicate window.
//
//   - A run task delivered again takes the lease over (above) and replays:
//     committed steps return their records; the inline step its
//     predecessor was running, not committed, runs again under the same
//     step ID as the next attempt (pass the ID as the Idempotency-Key of
//     external calls).
//   - A wake that finds nothing new replays and parks again: it runs no
//     step that is committed or begun.
//   - A branch task delivered again finds its step committed (done), or
//     runs it as the next attempt, counted in the attempt record, so that
//     a crash loop uses up MaxAttempts and then fails the step without
//     running it. A retry whose attempt already started, or a redispatched
//     task while a retry timer of its step waits, is dropped.
//
// # Waits: sleeps, events and hooks
//
// A wait (wait.go, WaitSpec) is a step that runs no function: a sleep, a
// wait for an event by run ID and name (step <run>.event=<name>.<n>) or on
// a hook token (<run>.hook=<name>.<n>). The holder that reaches it looks it
// up (an event may have come before the wait), and otherwise stores what
// will end it: a deadline (a sleep's, a timeout's) as a run timer, a hook's
// token in the hooks bucket, and for a wait with no deadline a recheck
// timer due after WaitRecheck, so a waiting run always has a message that
// will wake it. An event is committed by a Sender (deliver.go) into the
// first wait step of its name without a record (or the hook's step), and
// the sender wakes the run. Every one of these writes is create-if-absent
// on the wait's step record: the first wins, a repeat of the same event is
// a duplicate, and a wait ends once.
package workflow
