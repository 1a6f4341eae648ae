// Command producer starts, reads, cancels, unblocks, lists and resets jetflow runs
// and sends them events from the command line, and serves them over HTTP.
//
//	producer start <workflow> <json-input> --id RUNID | --generate-id [--attr NAME=VALUE]...
//	producer get <run-id>
//	producer watch <run-id> [--interval 1s] [--timeout 60s]
//	producer wait <run-id> [--timeout 60s]
//	producer cancel <run-id>
//	producer unblock <run-id> [--accept-divergence]
//	producer rerun <run-id> [--from STEP] [--id RUNID] [--dry-run]
//	producer send <run-id> <event-name> --event-id ID [--data JSON]
//	producer resume <token> --event-id ID [--data JSON]
//	producer list [--workflow W] [--status S] [--prefix P] [--attr NAME=VALUE]... [--since T] [--until T] [--limit N] [--cursor C]
//	producer list --counts [--workflow W]
//	producer reset <key> --scope global|workflow|run [--workflow W | --run-id R]
//	producer workers
//	producer engine
//	producer serve [--http-addr 127.0.0.1:8080] [--api-token T] [--webhooks FILE]
//
// Flags may come anywhere on the line; --output json prints the JSON shapes of
// the HTTP API (the JSON encodings of jetflow.Run, StartResult, RunPage and
// RunCounts; get adds the run's steps and open steps as GET /v1/runs/{id}
// does).
//
// # Timeline
//
// get prints a run's timeline (internal/server/timeline): a header (run ID,
// workflow, status, generation, created and updated, duration, input,
// output or error, the duplicate starts it absorbed), then one line per
// step in call order: its offset from the run's start, duration, name,
// step ID (what went out as Idempotency-Key), attempt, worker, task key
// (hit or miss), what it waited for or started, and its error; the failed
// earlier attempts of a step indented under it; the open steps (running,
// or retrying) last. The status is coloured only when stdout is a terminal
// and NO_COLOR is unset; control characters of stored text (an ANSI escape,
// a newline in an error) are printed escaped. watch prints the same, then
// each new step line and status change as it happens, and ends when the run
// does, with wait's exit code: between readings it waits on the run's
// record (Client.WaitRun) for at most --interval, so it does not poll in
// a loop. list prints runs newest first by their last status change;
// --since and --until (RFC 3339) bound that time, --prefix the run ID,
// --attr NAME=VALUE (repeatable) the run's attributes, which start's
// --attr gives a run (jetflow.WithAttributes); list --counts prints how
// many runs are in each state. workers prints the workers running now
// (name, ID, the workflows each serves, since when, its last heartbeat)
// and every workflow the deployment knows with the workers serving it:
// "no worker running" marks one whose starts wait. engine prints where an
// upgrade of the engine stands (jetflow.Client.EngineStatus): this
// version's engine protocol, the live workers by protocol, each live worker
// of another protocol (name, protocol, build, last heartbeat), the runs
// and the tasks and timers of protocol 1 (the executor before the lease)
// left, the run records this version cannot read, and the runs under way
// by workflow and the build that started them. It exits 0 once no worker
// of another protocol is live and nothing of protocol 1 is left, so that a
// script can wait for it; otherwise it prints what is still to wait for on
// stderr ("waiting for: ...") and exits 6 while a worker of another
// protocol is live (this version's workers execute nothing meanwhile), 7
// while only runs or messages of protocol 1 are left.
//
// # NATS unavailable
//
// wait and watch ride out NATS being unavailable (not up yet, restarting,
// as when the worker that embeds it restarts): a connection or read that
// fails with jetflow.ErrUnavailable is tried again, with backoff from
// 100ms to 2s, and a note on stderr when the outage begins ("retrying:
// ..."). wait does so within its --timeout, which bounds the whole wait;
// watch for up to --timeout per outage. Unavailable past that, they exit
// with 5. The other commands fail at once with exit code 5: retry them.
//
// # Idempotency
//
// The run ID given with --id is the caller's idempotency key: starting the
// same ID again does not start a second run, it reports the existing one
// ("existing run ...", exit code 0). start needs --id or --generate-id (a
// new run with a generated ID each time); --id "" is an error, so that a
// script whose ID variable is unset fails instead of starting a run on
// every retry. The same ID with another input or
// another workflow is a conflict (exit code 4), and so is a duplicate the
// workflow's conflict policy rejects. reset forgets a task key
// (jetflow.WithTaskKey) so that the next step call with it runs again;
// it prints how many entries it deleted, 0 on a repeat. cancel is
// idempotent too: it cancels a running run and the child runs it started
// attached, and a repeat says the run "was already cancelled" (exit code 0
// both times); a run that had already completed or failed is an error
// (exit code 1) that names the state it ended in. unblock makes a blocked
// run (its code diverges from its history: get shows its block) go on,
// replayed with the workers' code; with --accept-divergence the history's
// step at the place the block names is waived and the code's step there
// runs again, its side effects repeated: unblock prints which. A run that
// is not blocked, or a block with no step to waive, is an error (exit code
// 1). rerun starts a new run (jetflow.Client.Rerun) of an ended run that
// keeps the run's committed steps before --from (a step name or step ID;
// default: the step the run failed at, else the one after its last
// committed step) and runs that step and the rest again under new step
// IDs; it prints the steps kept and the steps run again, and
// --dry-run starts nothing. The new run's ID is --id, by default
// <run-id>-rerun-<step>-<n>: a repeat finds it ("existing run"). A run
// that has not ended is a conflict (exit code 4), a step it never reached
// an error (exit code 1). send and resume deliver
// an event (jetflow.Client.SendEvent, Resume) under --event-id, which is
// required: the same event ID and payload again is a duplicate ("duplicate
// ...", exit code 0) and changes nothing; the same ID with another payload,
// or a second event to a hook whose wait has ended, is a conflict (exit
// code 4); an event for a run that has ended is an error (exit code 1).
// --data is the payload (JSON; absent: null).
//
// # Configuration
//
// Each setting is read from the command line, else from JETFLOW_<FLAG>
// (--nats-url from JETFLOW_NATS_URL), else from the YAML file named by
// --config or JETFLOW_CONFIG (keys are flag names), else its default. The
// flags of one invocation (--id, --generate-id, --timeout, --workflow,
// --status, --prefix, --attr, --since, --until, --limit, --cursor, --counts,
// --interval, --scope, --run-id, --event-id, --data, --accept-divergence,
// --from, --dry-run, --print-config) are read from the command line only. --print-config prints the effective
// settings, secrets redacted, and exits.
//
// # Serving
//
// serve runs the HTTP API (docs/http.md) under /v1/, with Prometheus metrics
// on /metrics, liveness on /healthz and readiness on /readyz, on one address,
// until SIGINT or SIGTERM, then drains in-flight requests. It listens
// before NATS is reachable and waits for it: until connected, and its
// engine's buckets bound, /healthz answers 200, /readyz 503 and the API
// 503 with Retry-After, while serve retries (logging "waiting for NATS at
// <url>" each attempt); it exits only for a setting that cannot be used,
// credentials the server refuses or TLS that cannot be agreed on. --api-token
// (comma-separated for several) protects the API; --webhooks names a YAML
// list of webhook sources:
//
//	# webhooks.yaml
//	- name: stripe            # POST /v1/webhooks/stripe, run IDs stripe-<event id>
//	  provider: stripe        # standard | github | stripe
//	  workflow: order
//	  secret_env: STRIPE_WEBHOOK_SECRET   # or a list; or secrets: [...] inline
//	  tolerance: 5m
//	  attributes:             # optional: run attributes read from each event
//	    order_id: /data/object/metadata/order_id   # a JSON pointer (RFC 6901)
//
// # Exit codes
//
//	0  success (start: the run was created or already existed)
//	1  usage or other error; cancel, send, resume: the run had already ended;
//	   unblock: the run is not blocked, or its block has no step to waive
//	2  wait, watch: the run failed or was cancelled
//	3  not found: no run has that ID, or (start) workers of the deployment
//	   run and none has ever served a workflow of that name, or (resume) no
//	   run waits on the hook token
//	4  conflict: the run ID names a run with another input or workflow, or the
//	   rerun's run has not ended; or the
//	   conflict policy rejected the duplicate; send, resume: the event ID was
//	   delivered with another payload, or the hook's wait has ended
//	5  unavailable: NATS cannot serve the command now (unreachable,
//	   reconnecting, JetStream unavailable, no answer in time; wait and
//	   watch retry it within --timeout first), or (start)
//	   no worker is running for a known workflow, or none of the
//	   deployment runs at all (none has reported yet) (or, send and resume,
//	   none answered); retry later, start with the same run ID, send with
//	   the same event ID (jetflow.ErrUnavailable)
//	6  engine: a worker of another engine protocol is live
//	7  engine: no worker of another protocol is live, but runs or messages
//	   of protocol 1 are left
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/server/lifecycle"
	"github.com/jetflow/jetflow/internal/server/timeline"
)

// Exit codes.
const (
	exitOK        = 0
	exitError     = 1 // usage and other errors
	exitRunFailed = 2 // wait, watch: the run failed or was cancelled
	exitNotFound  = 3 // no run has that ID, no workflow of that name, no hook of that token
	exitConflict  = 4 // idempotency conflict, a rejected duplicate, an event conflict, a rerun of a run not ended
	// exitUnavailable: a transient NATS condition (jetflow.ErrUnavailable);
	// retrying later is safe, a start with the same run ID.
	exitUnavailable = 5
	// exitForeignWorkers, exitOldWork: engine's answers that the upgrade
	// is not done (upgradeWait).
	exitForeignWorkers = 6
	exitOldWork        = 7
)

const usage = `Usage: producer [flags] <command> [arguments]

Commands:
  start <workflow> <json-input> --id RUNID | --generate-id [--attr NAME=VALUE]...
        start a run; the same RUNID again finds the existing run
  get <run-id>
        show a run's timeline: the run, its steps and attempts, its open steps
  watch <run-id> [--interval 1s] [--timeout 60s]
        show a run's timeline, then each change as it happens, until the run ends
  wait <run-id> [--timeout 60s]
        wait until a run ends and show its result
  cancel <run-id>
        cancel a running or blocked run and its child runs; a repeat says it was already cancelled
  unblock <run-id> [--accept-divergence]
        make a blocked run (its code diverges from its history) go on, replayed with the
        workers' code
  rerun <run-id> [--from STEP] [--id RUNID] [--dry-run]
        start a new run of an ended run that keeps its committed steps before STEP and
        runs STEP and the rest AGAIN under new step IDs (default STEP: where it failed)
  send <run-id> <event-name> --event-id ID [--data JSON]
        deliver an event to a run's wait for it; a repeat says "duplicate"
  resume <token> --event-id ID [--data JSON]
        deliver an event to the wait on a hook token; a repeat says "duplicate"
  list [--workflow W] [--status S] [--prefix P] [--attr NAME=VALUE]... [--since T] [--until T] [--limit N] [--cursor C]
        one page of runs, newest first by last status change, and the next cursor
  list --counts [--workflow W]
        how many runs are in each state
  reset <key> --scope global|workflow|run [--workflow W | --run-id R]
        forget a task idempotency key; prints how many entries were deleted
  workers
        the workers running now, and each known workflow with the workers serving it
  engine
        where an upgrade of the engine stands: the live workers by engine protocol, those
        of another protocol, what protocol 1 has left, the runs under way by build; exit 0
        once no worker of another protocol is live and nothing of protocol 1 is left
  serve [--http-addr ADDR] [--api-token T] [--webhooks FILE]
        serve the HTTP API on /v1/, plus /metrics, /healthz and /readyz

Flags (anywhere on the line):
  --output FORMAT        text or json (default text)
  --nats-url URLS        NATS servers, comma-separated (default nats://127.0.0.1:4222)
  --nats-user NAME       user authentication, with --nats-password
  --nats-password PW     (secret: prefer JETFLOW_NATS_PASSWORD to the command line)
  --nats-token TOKEN     token authentication (secret)
  --nats-nkey FILE       NKey seed file authentication
  --nats-creds FILE      JWT credentials file authentication
  --nats-tls-ca FILE     CAs that signed the server's certificate
  --nats-tls-cert FILE   client certificate, with --nats-tls-key FILE
  --nats-tls-key FILE    its private key
  --replicas N           replicas of buckets the producer creates: 1, or 3 on a
                         three-node cluster (default 1; must match the workers)
  --config FILE          YAML file of settings keyed by flag name
  --print-config         print the effective settings (secrets redacted) and exit
  -h, --help             this text

  start:  --id RUNID             the run ID, your idempotency key (required; "" is an error)
          --generate-id          instead of --id: a generated run ID, a new run each time
          --attr NAME=VALUE      an attribute of the run, repeatable (at most 8; a repeat
                                 start keeps the first start's)
  wait:   --timeout D            how long to wait (default 60s); NATS being unavailable
                                 meanwhile is retried within it
  watch:  --interval D           the longest time between two readings of the run (default 1s)
          --timeout D            how long one NATS outage is retried before exit 5 (default 60s)
  list:   --workflow W           only runs of workflow W
          --status S             only runs in state S: running, blocked, completed, failed,
                                 cancelled
          --prefix P             only run IDs starting with P
          --attr NAME=VALUE      only runs with this attribute, repeatable (all must match)
          --since T, --until T   only runs whose last status change is at or after --since
                                 and before --until (RFC 3339 times)
          --limit N              runs per page, 1..500 (default 50)
          --cursor C             the next page (the previous page's next cursor)
          --counts               instead, the number of runs in each state (with --workflow)
  reset:  --scope S              global, workflow (with --workflow) or run (with --run-id)
          --workflow W, --run-id R
  unblock: --accept-divergence  waive the history's step at the place the block names:
                                 the code's step there runs AGAIN, its side effects
                                 repeat (a second email, a second charge)
  rerun:  --from STEP            the first step to run again: a name (its first call) or a
                                 step ID (default: the step the run failed at, else the
                                 one after its last committed step)
          --id RUNID             the new run's ID (default <run-id>-rerun-<step>-<n>)
          --dry-run              print what would be kept and run again; start nothing
  send, resume:
          --event-id ID          the event's ID, the same on every retry (required)
          --data JSON            the event's payload (default null)
  serve:  --http-addr ADDR       listen address (default 127.0.0.1:8080)
          --ops-addr ADDR        serve /metrics, /healthz, /readyz here instead of on
                                 --http-addr (keep them off a public webhook port)
          --api-token T          bearer tokens the API requires, comma-separated (secret)
          --webhooks FILE        YAML list of webhook sources (format: go doc ./cmd/producer)
          --request-timeout D    bound on each start and read against NATS (default 10s)
          --log-format F         json or console (default console on a terminal, json otherwise)
          --log-level L          trace, debug, info, warn or error (default info)

Each setting is taken from the command line, else from JETFLOW_<FLAG>
(JETFLOW_NATS_URL, JETFLOW_API_TOKEN, ...), else from the --config file
(or JETFLOW_CONFIG), else its default. --id, --generate-id, --timeout,
--workflow, --status, --prefix, --attr, --since, --until, --limit, --cursor, --counts,
--interval, --scope, --run-id, --event-id, --data, --accept-divergence, --from,
--dry-run and --print-config are read from the command line only. Colour: only on a terminal, never with NO_COLOR set.

Exit codes:
  0  success (start: the run was created, or it existed: the output says "existing")
  1  usage or other error; cancel, send, resume: the run had already ended; unblock:
     the run is not blocked, or its block has no step to waive
  2  wait, watch: the run failed or was cancelled
  3  not found: no run has that ID, no worker ever served that workflow (while workers
     of the deployment run), or no run waits on the hook token
  4  conflict: the run ID has another input or workflow, or the policy rejected the
     duplicate; rerun: the run has not ended; the event ID was delivered with another payload, or the hook's wait ended
  5  unavailable: NATS cannot serve the command now (down, reconnecting, no answer in
     time; wait and watch retry it within --timeout first), or no worker is running for a known workflow, or none has reported yet;
     retry later, start with the same run ID, send with the same event ID
  6  engine: a worker of another engine protocol is live (stderr names it)
  7  engine: no worker of another protocol is live, but runs or messages of protocol 1
     are left
`

func main() {
	// After the first signal, a second one kills the process.
	ctx, stop := lifecycle.SignalContext(context.Background())
	zerolog.TimeFieldFormat = time.RFC3339Nano
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process exit code. Results
// go to stdout; errors go to stderr, one line each (serve logs there).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c, err := parseArgs(args, getenv, logging.IsTerminal(stderr), stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return exitOK
	case errors.Is(err, errConfigPrinted):
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "error: %v (see producer -h)\n", err)
		return exitError
	}

	if c.command == "serve" {
		log := logging.New(stderr, c.serve.logFormat, c.serve.logLevel)
		if err := serve(ctx, c, getenv, log, serveHooks{}); err != nil {
			log.Error().Err(err).Msg("producer serve failed")
			return exitCode(err)
		}
		return exitOK
	}

	// wait and watch ride out NATS being unavailable within --timeout
	// (wait: the whole wait; watch: each outage); the other commands fail
	// at once with exit code 5.
	var p *patience
	switch c.command {
	case "wait":
		p = &patience{deadline: time.Now().Add(c.timeout), notes: stderr}
	case "watch":
		p = &patience{window: c.timeout, notes: stderr}
	}
	nc, client, err := connect(ctx, c, p)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitCode(err)
	}
	defer nc.Close()

	// Colour only for a terminal, and never under NO_COLOR (no-color.org).
	out := &printer{w: stdout, json: c.output == "json", color: logging.IsTerminal(stdout) && getenv("NO_COLOR") == ""}
	switch c.command {
	case "start":
		err = start(ctx, client, out, c.args[0], c.args[1], c.id, c.generateID, c.attrs)
	case "get":
		err = get(ctx, client, out, c.args[0])
	case "watch":
		err = watch(ctx, client, out, c.args[0], c.interval, p)
	case "wait":
		err = wait(ctx, client, out, c.args[0], c.timeout, p)
	case "cancel":
		err = cancelRun(ctx, client, out, c.args[0])
	case "unblock":
		err = unblock(ctx, client, out, c.args[0], c.acceptDivergence)
	case "rerun":
		err = rerun(ctx, client, out, c.args[0], jetflow.RerunOptions{From: c.from, RunID: c.id, DryRun: c.dryRun})
	case "send":
		err = sendEvent(ctx, client, out, c.args[0], c.args[1], c.eventID, c.data)
	case "resume":
		err = resumeHook(ctx, client, out, c.args[0], c.eventID, c.data)
	case "list":
		if c.counts {
			err = counts(ctx, client, out, c.workflow)
		} else {
			err = list(ctx, client, out, c.listOptions())
		}
	case "reset":
		err = reset(ctx, client, out, c.args[0], c.scope, c.scopeID())
	case "workers":
		err = workers(ctx, client, out)
	case "engine":
		err = engine(ctx, client, out)
	}
	var wait *upgradeWait
	if errors.As(err, &wait) {
		fmt.Fprintf(stderr, "waiting for: %s\n", timeline.Clean(wait.what))
		return wait.code
	}
	if err != nil {
		// A run's error holds what its workflow wrote (inputs and all):
		// its control characters are shown escaped, never sent to the
		// terminal.
		fmt.Fprintf(stderr, "error: %s\n", timeline.Clean(err.Error()))
	}
	return exitCode(err)
}

// newClient binds a jetflow client to nc with the deployment's topology.
// cfg's Name and Topology are set here; the rest is the caller's.
func newClient(ctx context.Context, nc *nats.Conn, c cli, cfg jetflow.ClientConfig) (*jetflow.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	cfg.Name, cfg.Topology = "producer", jetflow.Topology{Replicas: c.replicas}
	// A rerun is admitted by a worker, as a start is: the producer's NATS
	// user (jetflow_producer, jetflow_operator) may not publish tasks.
	cfg.StartByRequest = true
	return jetflow.NewClient(ctx, nc, cfg)
}

// exitCode maps a command's error to the process exit code.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, jetflow.ErrRunNotFound), errors.Is(err, jetflow.ErrUnknownWorkflow), errors.Is(err, jetflow.ErrHookNotFound):
		return exitNotFound
	case errors.Is(err, jetflow.ErrRunFailed):
		return exitRunFailed
	case errors.Is(err, jetflow.ErrIdempotencyConflict), errors.Is(err, jetflow.ErrDuplicateRejected), errors.Is(err, jetflow.ErrEventConflict),
		errors.Is(err, jetflow.ErrRunNotEnded):
		return exitConflict
	case jetstream.IsTransient(err):
		return exitUnavailable
	default:
		return exitError
	}
}
