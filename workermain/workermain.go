package workermain

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
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/server/lifecycle"
)

// Exit codes of Main and Run.
const (
	// ExitOK: the worker drained and stopped after a signal (or ctx's end),
	// or -h or --print-config was served.
	ExitOK = 0
	// ExitError: a failure to start (NATS unreachable, refused
	// credentials, the embedded server's port or the operations address
	// taken), an operations server failure, or a drain that ran out of
	// --drain-timeout.
	ExitError = 1
	// ExitUsage: a bad command line or setting (an unknown flag, a value
	// a flag rejects, from the command line, JETFLOW_<FLAG> or the config
	// file), as Go's flag package exits.
	ExitUsage = 2
	// ExitWouldBlock: check found runs in flight that the code would block
	// (it lists them).
	ExitWouldBlock = 3
)

// Main runs the worker command over the workflows of ws with the process's
// arguments, environment, stdout and stderr, until SIGINT or SIGTERM (a
// second signal kills the process), and returns the exit code for os.Exit:
//
//	func main() {
//		ws := jetflow.NewRegistry()
//		if err := ws.Register(myWorkflow); err != nil {
//			log.Fatal(err)
//		}
//		os.Exit(workermain.Main(ws))
//	}
//
// It sets zerolog.TimeFieldFormat to RFC 3339 with nanoseconds.
func Main(ws *jetflow.Registry, opts ...Option) int {
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return Run(ctx, ws, os.Args[1:], opts...)
}

// Run is Main without the process: it reads args (without the program
// name), serves until ctx is done, drains, and returns the exit code. The
// environment, stdout and stderr are the process's unless WithEnv and
// WithOutput say otherwise.
//
// With "check" first in args it serves nothing: it checks the code of ws
// against the runs in flight of the deployment (see check) and returns
// ExitOK when it would block none, ExitWouldBlock when it would block
// some.
func Run(ctx context.Context, ws *jetflow.Registry, args []string, opts ...Option) int {
	p := newProgram(opts)
	if len(args) > 0 && args[0] == checkCommand {
		p.check, args = true, args[1:]
	}
	cfg, err := p.parseConfig(args, p.getenv, logging.IsTerminal(p.stderr), p.stdout, p.stderr)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errConfigPrinted) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(p.stderr, "%s: %v\n", p.name, err)
		return ExitUsage
	}
	log := logging.New(p.stderr, cfg.LogFormat, cfg.LogLevel)
	if p.check {
		return p.runCheck(ctx, ws, cfg, log)
	}
	if err := p.serve(ctx, ws, cfg, log); err != nil {
		log.Error().Err(err).Msg("worker failed")
		return ExitError
	}
	return ExitOK
}

// Option configures Main and Run.
type Option func(*program)

// WithName sets the program's name, used in its usage text, its error
// messages and its NATS connection name ("jetflow-" + name); default
// "worker". It does not name the worker: each worker process is named
// <host>-<pid>-<random> (jetflow.WorkerConfig.Name), which is what step
// records, logs (worker) and producer workers show.
func WithName(name string) Option { return func(p *program) { p.name = name } }

// WithDescription sets the sentence the usage text (-h) starts with;
// default "Runs a jetflow worker."
func WithDescription(text string) Option { return func(p *program) { p.description = text } }

// WithFlags defines flags of the program's own on the worker's flag set,
// next to the worker's (do not redefine those, nor --output, check's). They are read like the
// others: command line, JETFLOW_<FLAG>, config file, default; --print-config
// prints them. Read their values in the WithSetup function.
func WithFlags(define func(fs *flag.FlagSet)) Option { return func(p *program) { p.flags = define } }

// Setup is what a WithSetup function gets: the worker's logger and its
// NATS connection.
type Setup struct {
	Logger zerolog.Logger
	Conn   *nats.Conn
}

// WithSetup runs setup once the configuration is read and NATS is
// connected, before the worker is created: it may start what the workflows
// need (a client of another service, a local test server) and add
// workflows to the registry given to Main. check runs it too, for the
// workflows it adds, and closes it when done. An error stops the command
// (ExitError). The returned close function, if not nil, runs after the
// worker has drained, before NATS is disconnected.
func WithSetup(setup func(ctx context.Context, s Setup) (close func(), err error)) Option {
	return func(p *program) { p.setup = setup }
}

// Endpoints are the addresses a started worker uses and serves.
type Endpoints struct {
	// NatsURL is the NATS URL the worker is connected to (the embedded
	// server's when it runs one). It may hold credentials: redact it
	// before logging.
	NatsURL string
	// OpsURL is the operations server's base URL (http://host:port), empty
	// when --ops-addr is empty.
	OpsURL string
}

// WithReady calls ready once the worker has started and serves, with its
// endpoints: for a message to the user, or for tests.
func WithReady(ready func(Endpoints)) Option { return func(p *program) { p.ready = ready } }

// WithEnv reads environment variables through getenv instead of os.Getenv.
func WithEnv(getenv func(string) string) Option { return func(p *program) { p.getenv = getenv } }

// WithOutput writes --print-config to stdout and usage, errors and logs to
// stderr instead of os.Stdout and os.Stderr. The default log format is
// console when stderr is a terminal, JSON lines otherwise.
func WithOutput(stdout, stderr io.Writer) Option {
	return func(p *program) { p.stdout, p.stderr = stdout, stderr }
}

// program is one worker command, as its options make it.
type program struct {
	// check: the command line starts with "check" (Run).
	check       bool
	name        string
	description string
	flags       func(*flag.FlagSet)
	setup       func(context.Context, Setup) (func(), error)
	ready       func(Endpoints)
	getenv      func(string) string
	stdout      io.Writer
	stderr      io.Writer
}

func newProgram(opts []Option) *program {
	p := &program{
		name:        "worker",
		description: "Runs a jetflow worker.",
		getenv:      os.Getenv,
		stdout:      os.Stdout,
		stderr:      os.Stderr,
	}
	for _, o := range opts {
		o(p)
	}
	return p
}
