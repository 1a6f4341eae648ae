// Package jetflow is a durable workflow engine on NATS JetStream for work
// that must never happen twice: webhook handlers, orders and payments,
// transactional email.
//
// # Runs and run IDs
//
// A service starts a run of a workflow under its own run ID, an idempotency
// key derived from the work, such as "order-o-1" for order o-1 (WithRunID).
// Every start with that ID — a re-delivered webhook, a retried request, two
// replicas racing — lands on the same run: exactly one start gets
// OutcomeCreated, every other one gets OutcomeExisting with the run's state
// and how many duplicates it has absorbed. This holds beyond the broker's
// duplicate window and across NATS restarts, because the run record is
// written with create-if-absent. A run ID is never made up for the caller:
// a start names one, or asks for a generated one explicitly
// (WithGeneratedRunID: a new run each time), and an empty or absent run ID
// is an error (ErrInvalidRunID, ErrRunIDRequired).
//
// # Workflows and steps
//
// A workflow is a typed function with a stable name (NewWorkflow). Its body
// orchestrates steps (Step) and is replayed, so it must be deterministic.
// Each step has a deterministic step ID — run ID, step name, occurrence —
// that StepDetailsFrom gives the running step, to pass as the
// Idempotency-Key of external APIs. A step's result is committed before its task message is
// acknowledged: a committed step never runs again; a step whose worker died
// before the commit runs again with the same step ID.
//
// Steps started with Go run at the same time, each as a task of its own;
// AwaitAll, AwaitFirst and GetAll wait for them, and Child starts a run of
// another workflow as a step. docs/workflows.md shows them.
//
// # Sleep, events and hooks
//
// A run can wait without holding anything: no worker slot, no goroutine,
// no timer in memory. Sleep and SleepUntil pause it durably: the wake-up
// is a message the NATS server stores and publishes when due, so it
// survives worker and server restarts, wakes the run once and never
// early. WaitEvent waits for an event the workflow declares (WithEvent[T])
// and returns its typed payload; a client sends it to the run by run ID
// and name (Client.SendEvent), with an event ID: a repeat is
// EventDuplicate and changes nothing, and an event sent before the body
// reaches its wait is kept. WithHookToken makes the wait a hook, resumed by
// a token the workflow chooses (Client.Resume), single-use. WithTimeout
// ends a wait with ErrEventTimeout; OnEvent and Timer are the futures to
// race an event against a timer with AwaitFirst. The same events come in
// over NATS (jetflow.events, docs/protocol.md), HTTP (docs/http.md) and
// the producer CLI, with one vocabulary of outcomes.
//
// # Duplicates, conflicts and keys
//
// What a duplicate start gets depends on the run's state and the
// ConflictPolicy (attach or reject while running; return, reject or start a
// new run once ended), set per workflow (WithDefaultConflictPolicy) or per
// start (WithConflictPolicy). A duplicate whose input differs from the run's
// (compared as canonical JSON) is ErrIdempotencyConflict unless
// WithFingerprintMode(FingerprintIgnore). Every duplicate attempt is recorded
// on the run (Run.RecentDuplicates). A step called WithTaskKey reuses the
// result of an earlier call with the same task key, across runs, for a TTL.
// Three different things are idempotency keys to someone: the run ID (a
// start's), the step ID (what an external API receives) and the task key (a
// result several step calls share).
// A run ID is remembered for its workflow's retention (WithRetention); a
// start after that says so (Handle.AfterExpiry). docs/idempotency.md walks
// through all of it with runnable examples.
//
// # Errors
//
// Step errors are retried with backoff (Retryable, RetryAfter) unless Fatal.
// A step's final failure reaches the workflow as a *StepError it can handle.
// A step that fails with ErrorWithCode(code, err) commits the code: the
// workflow branches on StepError.Code (or reaches the *CodedError with
// errors.As) on every replay. A run that does not complete is reported as a
// *RunError, with the code of the error it failed with in Code. Sentinels
// (ErrInvalidRunID, ErrUnknownWorkflow, ...) match with errors.Is.
// ErrUnavailable marks every transient NATS condition (NATS down or
// reconnecting, a timeout, JetStream unavailable): retry later, a start
// with the same run ID.
//
// # Processes
//
// A Worker executes runs of the workflows in its registry (NewRegistry); a
// Client starts and reads runs. Both take a *nats.Conn; cmd/worker starts an
// embedded NATS server when no URL is given. See docs/ARCHITECTURE.md for the
// streams, subjects and buckets, and for what happens on a crash between any
// two writes.
package jetflow
