// Package workermain is the jetflow worker command as a library: a team's
// worker binary is a main that registers its workflows and hands over to
// Main, which does what cmd/worker does.
//
//	func main() {
//		ws := jetflow.NewRegistry()
//		if err := ws.Register(signup.Workflow()); err != nil {
//			log.Fatal(err)
//		}
//		os.Exit(workermain.Main(ws))
//	}
//
// # What the command does
//
// With no --nats-url it starts an embedded NATS server with JetStream on
// 127.0.0.1:4222 (data in ./jetflow-data, package embedded), so that
// producers and more workers can connect to it. With --nats-url it joins an
// existing NATS deployment instead, optionally authenticating with
// --nats-user and --nats-password, --nats-token, --nats-nkey or
// --nats-creds, and using TLS with --nats-tls-ca (and --nats-tls-cert and
// --nats-tls-key where the server verifies clients). Those flags are
// refused with the embedded server, which has neither. --replicas 3
// replicates the engine's streams and buckets on a three-node cluster;
// every worker and producer of a deployment must agree on it, as on
// --duplicate-window (the broker's Nats-Msg-Id window, default 2m). A start
// that changes an existing stream's or bucket's configuration logs at warn
// what it changed, from what to what. An embedded server's port that is
// taken is an error at once, naming --port and --nats-url.
//
// It serves until SIGINT or SIGTERM, then stops taking work, lets running
// steps finish for up to --drain-timeout, and exits; a second signal exits
// at once. Exit codes: ExitOK, ExitError, and ExitUsage (2) for a bad flag,
// argument or setting, as Go's flag package exits (and ExitWouldBlock, of
// check); -h lists them.
//
// # Configuration
//
// Each flag is read from the command line, else from JETFLOW_<FLAG>
// (--ack-wait from JETFLOW_ACK_WAIT), else from the YAML file named by
// --config or JETFLOW_CONFIG (keys are flag names), else its default.
// --print-config prints the effective settings as such a file, with where
// each came from, secrets redacted, and exits. WithFlags adds flags of the
// program's own, read the same way. -h lists them all.
//
// # Builds and the check before serving
//
// --build (JETFLOW_BUILD) is the worker's build identity
// (jetflow.WorkerConfig.Build; empty: the binary's VCS revision), recorded
// on the runs it starts and blocks; an invalid one fails the start
// (ExitError, jetflow.ErrInvalidBuild). --check-before-serving
// (jetflow.WorkerConfig.CheckBeforeServing) replays the worker's code
// against every run in flight of its workflows before it takes any work:
// while it would block some, the worker waits, unready, /readyz and a warn
// line each attempt naming the runs and their divergences, and tries again,
// as it does while workers of another engine protocol are live.
//
// # Checking the code in CI
//
// "<worker> check" (check first on the line) serves nothing: it connects
// to the deployment at --nats-url as the worker would (the same flags,
// environment and config file), runs the WithSetup function, and replays
// the worker's workflows, as the build --build names (or the binary's VCS
// revision), against every run in flight (jetflow.Client.CheckCode),
// running no step, creating no consumer and announcing no worker. It
// prints each run the code would block with its divergence (--output
// json: {"build", "checked", "blocked"}), and exits ExitOK when none
// would be blocked, ExitWouldBlock (3) when some would, ExitError when it
// could not check:
//
//	signup-worker check --nats-url nats://nats-1:4222 --build "$GIT_SHA"
//
// # Operations
//
// --ops-addr (default 127.0.0.1:8081, empty disables) serves Prometheus
// metrics on /metrics, liveness on /healthz and readiness on /readyz (the
// worker is started, connected, and its streams, buckets and consumers are
// in place). Logs are JSON lines on stderr (console on a terminal;
// --log-format, --log-level); every line about a run carries workflow and
// run_id, and durations are strings with their unit (package
// internal/logging). With OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, the worker exports OpenTelemetry
// spans of its starts, runs and steps over OTLP/HTTP, as OTEL_SERVICE_NAME
// (default jetflow-<name>), and flushes them after its drain
// (docs/tracing.md).
package workermain
