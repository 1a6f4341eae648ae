package workermain

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/logging"
	conf "github.com/jetflow/jetflow/internal/server/config"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

// errConfigPrinted is parseConfig's answer to --print-config: the
// configuration was printed and the worker should exit without running.
var errConfigPrinted = errors.New("configuration printed")

// config is the worker's configuration. Every flag takes its value from the
// command line, else from an environment variable named after it
// (--ack-wait reads JETFLOW_ACK_WAIT), else from the YAML file named by
// --config or JETFLOW_CONFIG, else from its default (package
// internal/server/config).
type config struct {
	NATS       natsconn.Options
	DataDir    string
	Host       string
	Port       int
	SyncAlways bool
	Replicas   int
	// DuplicateWindow is the broker's Nats-Msg-Id window on the engine's
	// streams (jetflow.Topology.DuplicateWindow).
	DuplicateWindow time.Duration
	Concurrency     int
	AckWait         time.Duration
	// ApplyAckWait makes AckWait the deployment's on existing consumers
	// (jetflow.WorkerConfig.ApplyAckWait).
	ApplyAckWait bool
	DrainTimeout time.Duration
	// SweepInterval and StuckAfter set the stuck-run sweeper
	// (jetflow.WorkerConfig).
	SweepInterval time.Duration
	StuckAfter    time.Duration
	// Build is the worker's build identity (jetflow.WorkerConfig.Build;
	// empty: the binary's VCS revision), checked by jetflow.NewWorker.
	Build string
	// CheckBeforeServing: jetflow.WorkerConfig.CheckBeforeServing.
	CheckBeforeServing bool
	OpsAddr            string
	LogFormat          string
	LogLevel           zerolog.Level
	// Output is check's: text or json (command line only).
	Output string
}

// topology is the engine's topology the settings give
// (jetflow.WorkerConfig.Topology).
func (c config) topology() jetflow.Topology {
	return jetflow.Topology{Replicas: c.Replicas, DuplicateWindow: c.DuplicateWindow}
}

// embedded reports whether the worker runs its own NATS server.
func (c config) embedded() bool { return c.NATS.URL == "" }

// usageHead is the top of the usage text: the program's name, then its
// description.
const usageHead = `Usage: %[1]s [flags]
       %[1]s check --nats-url URL [--build BUILD] [--output json] [flags]

%[2]s With no --nats-url it starts an embedded
NATS server with JetStream; with --nats-url it joins an existing deployment.

check (first on the line) replays this worker's code, its workflows as
built for the --build given (empty: the binary's VCS revision), against
every run in flight of the deployment at --nats-url, running no step and
taking no work, and lists each run the code would block with its
divergence: for CI, before a deploy. It reads the worker's settings as
the worker does and ignores those of serving.

Each flag is taken from, in order: the command line; the environment variable
JETFLOW_<FLAG> (e.g. JETFLOW_NATS_URL, JETFLOW_ACK_WAIT); the YAML file named
by --config or JETFLOW_CONFIG, whose keys are flag names (ack-wait: 30s);
the default. --print-config prints the result as such a file, secrets
redacted.

Exit codes:
  0  stopped after SIGINT/SIGTERM, having drained; or -h, --print-config
  1  failed to start (NATS unreachable, credentials refused, the embedded
     server's --port or the --ops-addr taken, an invalid --build), the
     operations server failed, or the drain ran out of --drain-timeout
  2  a bad flag, argument or setting (command line, environment or file)
  3  check: the code would block runs in flight (listed on stdout)

Flags:
`

// parseConfig reads args (without the program name), the environment
// through getenv and the config file into the worker's flags and the
// program's own (WithFlags), and validates the result.
// stderrIsTerminal picks the default log format. Usage and -h go to usage.
// With --print-config it prints the configuration to stdout and returns
// errConfigPrinted. A bad value is reported with the flag's name and where
// the value came from.
func (p *program) parseConfig(args []string, getenv func(string) string, stderrIsTerminal bool, stdout, usage io.Writer) (config, error) {
	var (
		c           config
		logLevel    string
		printConfig bool
	)
	fs := flag.NewFlagSet(p.name, flag.ContinueOnError)
	fs.SetOutput(usage)
	natsconn.Register(fs, &c.NATS)
	fs.Lookup(natsconn.FlagURL).Usage = "NATS server `URL`s, comma-separated; empty starts an embedded server. " +
		"The other --nats-* flags need it"
	fs.StringVar(&c.DataDir, "data-dir", "./jetflow-data", "embedded server: JetStream file store directory")
	fs.StringVar(&c.Host, "host", "127.0.0.1", "embedded server: address to listen on")
	fs.IntVar(&c.Port, "port", 4222, "embedded server: port to listen on (-1 for a random one)")
	fs.BoolVar(&c.SyncAlways, "sync-always", false, "embedded server: fsync every write (survives an OS crash, much slower)")
	fs.IntVar(&c.Replicas, "replicas", 1, "replicas of the engine's streams and buckets: 1, or 3 on a three-node cluster (needs --nats-url)")
	fs.DurationVar(&c.DuplicateWindow, "duplicate-window", 2*time.Minute, "the broker's Nats-Msg-Id duplicate window on the engine's streams (see docs/idempotency.md); the last worker to start sets it")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "how many steps run at once")
	fs.DurationVar(&c.AckWait, "ack-wait", 30*time.Second, "how long before a crashed worker's step is redelivered, for consumers this worker creates (an existing consumer keeps the deployment's; see --apply-ack-wait)")
	fs.BoolVar(&c.ApplyAckWait, "apply-ack-wait", false, "make --ack-wait the deployment's AckWait on existing consumers too (a shorter one is announced to running workers first)")
	fs.DurationVar(&c.SweepInterval, "sweep-interval", time.Minute, "how often to look for stuck runs (running, no pending task or timer); negative disables")
	fs.DurationVar(&c.StuckAfter, "stuck-after", 0, "how long a run is left alone before the sweeper checks it (0: 5m, or 3 × --ack-wait when that is more)")
	fs.StringVar(&c.Build, "build", "", "this worker's build identity, 1..64 characters of [A-Za-z0-9._+-] (a version, a release name), "+
		"recorded on the runs it starts and blocks (empty: the binary's VCS revision)")
	fs.BoolVar(&c.CheckBeforeServing, "check-before-serving", false, "before taking any work, replay this code against the runs in flight "+
		"and wait, unready, while it would block some (docs/changing-workflows.md)")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long running steps may take to finish")
	fs.StringVar(&c.OpsAddr, "ops-addr", "127.0.0.1:8081", "`address` serving /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&c.LogFormat, "log-format", "", "json or console (default console on a terminal, json otherwise)")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	fs.BoolVar(&printConfig, "print-config", false, "print the effective configuration as YAML (secrets redacted) and exit")
	fs.StringVar(&c.Output, "output", "text", "check only: text or json")
	conf.CommandLineOnly(fs, "print-config", "output")
	if p.flags != nil {
		p.flags(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(usage, usageHead, p.name, p.description)
		conf.PrintFlags(usage, fs)
	}

	origins, err := conf.Load(fs, args, getenv)
	if err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 && fs.Arg(0) == checkCommand {
		return config{}, fmt.Errorf("%s comes first: %s %s [flags]", checkCommand, p.name, checkCommand)
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := p.checkFlags(c, origins); err != nil {
		return config{}, err
	}
	c.LogFormat = logging.ChooseFormat(c.LogFormat, stderrIsTerminal)
	lvl, err := zerolog.ParseLevel(logLevel)
	if err != nil || logLevel == "" {
		return config{}, fmt.Errorf("invalid value %q for %s: want trace, debug, info, warn or error", logLevel, origins.Flag("log-level"))
	}
	c.LogLevel = lvl
	if err := c.validate(origins); err != nil {
		return config{}, err
	}
	if printConfig {
		if err := conf.Print(stdout, fs, origins); err != nil {
			return config{}, fmt.Errorf("print config: %w", err)
		}
		return c, errConfigPrinted
	}
	return c, nil
}

// validate names the first bad setting and where its value came from.
func (c config) validate(o conf.Origins) error {
	switch {
	case c.LogFormat != "json" && c.LogFormat != "console":
		return fmt.Errorf("invalid value %q for %s: want json or console", c.LogFormat, o.Flag("log-format"))
	case c.Concurrency < 1:
		return fmt.Errorf("invalid value %d for %s: must be at least 1", c.Concurrency, o.Flag("concurrency"))
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("invalid value %s for %s: must be at least 100ms", c.AckWait, o.Flag("ack-wait"))
	case c.SweepInterval >= 0 && c.SweepInterval < 10*time.Millisecond:
		return fmt.Errorf("invalid value %s for %s: must be at least 10ms, or negative to disable the sweeper", c.SweepInterval, o.Flag("sweep-interval"))
	case c.StuckAfter != 0 && c.StuckAfter < 3*c.AckWait:
		return fmt.Errorf("invalid value %s for %s: must be at least 3 × --ack-wait (%s)", c.StuckAfter, o.Flag("stuck-after"), 3*c.AckWait)
	case c.DuplicateWindow < 100*time.Millisecond:
		return fmt.Errorf("invalid value %s for %s: must be at least 100ms", c.DuplicateWindow, o.Flag("duplicate-window"))
	case c.DrainTimeout <= 0:
		return fmt.Errorf("invalid value %s for %s: must be positive", c.DrainTimeout, o.Flag("drain-timeout"))
	case c.Replicas != 1 && c.Replicas != 3:
		return fmt.Errorf("invalid value %d for %s: want 1, or 3 on a three-node cluster", c.Replicas, o.Flag("replicas"))
	}
	if err := checkAddr(c.OpsAddr); err != nil {
		return fmt.Errorf("invalid value %q for %s: %w", c.OpsAddr, o.Flag("ops-addr"), err)
	}
	if !c.embedded() {
		return c.NATS.Validate()
	}
	if set := c.NATS.SecurityFlags(); len(set) > 0 {
		return fmt.Errorf("%s requires --nats-url: the embedded server has no authentication or TLS", o.Flag(set[0]))
	}
	switch {
	case c.Replicas != 1:
		return fmt.Errorf("invalid value %d for %s: the embedded server is a single node; use --nats-url with a three-node cluster", c.Replicas, o.Flag("replicas"))
	case c.DataDir == "":
		return fmt.Errorf("invalid value \"\" for %s: required when --nats-url is not set", o.Flag("data-dir"))
	case c.Port < -1 || c.Port == 0 || c.Port > 65535:
		return fmt.Errorf("invalid value %d for %s: want 1..65535, or -1 for a random port", c.Port, o.Flag("port"))
	}
	return nil
}

// checkAddr accepts "" (disabled) or host:port with a port in 0..65535.
func checkAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if err := opshttp.CheckAddr(addr); err != nil {
		return fmt.Errorf("%w, or empty to disable", err)
	}
	return nil
}

// checkFlags checks what only check takes (--output) and what it needs
// (--nats-url: the deployment it checks against).
func (p *program) checkFlags(c config, o conf.Origins) error {
	switch {
	case !p.check && o["output"].Source == conf.FromFlag:
		return fmt.Errorf("--output is a flag of %s %s", p.name, checkCommand)
	case c.Output != "text" && c.Output != "json":
		return fmt.Errorf("invalid value %q for --output: want text or json", c.Output)
	case p.check && c.embedded():
		return fmt.Errorf("%s needs --nats-url (JETFLOW_NATS_URL, nats-url: in the config file): the deployment whose runs in flight it replays", checkCommand)
	}
	return nil
}
