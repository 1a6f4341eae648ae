// Command producer starts and reads jetflow runs from the command line.
//
//	producer start <workflow> <json-input> [--id RUNID]
//	producer get <run-id>
//	producer wait <run-id> [--timeout 60s]
//
// The run ID given with --id is the caller's idempotency key: starting the
// same ID again does not start a second run, it reports the existing one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow"
)

// Exit codes.
const (
	exitOK        = 0
	exitError     = 1 // usage and other errors
	exitRunFailed = 2 // wait: the run failed or was cancelled
	exitNotFound  = 3 // no run has that ID
)

const usage = `Usage: producer [flags] <command> [arguments]

Commands:
  start <workflow> <json-input> [--id RUNID]  start a run; the same RUNID again finds the existing run
  get <run-id>                                show a run and its committed steps
  wait <run-id> [--timeout 60s]               wait until a run ends and show its result

Flags (anywhere on the line):
  --nats-url URL   NATS server (env JETFLOW_NATS_URL; default nats://127.0.0.1:4222)
  --output FORMAT  text or json (default text)
  --id RUNID       start: the run ID, your idempotency key (default: generated)
  --timeout D      wait: how long to wait (default 60s)

Exit codes: 0 success, 1 usage or other error, 2 run failed, 3 run not found.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cli is a parsed command line.
type cli struct {
	natsURL string
	output  string
	id      string
	timeout time.Duration
	command string
	args    []string
}

// run executes one command line and returns the process exit code. Results
// go to stdout; errors go to stderr, one line each.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c, err := parseArgs(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v (see producer -h)\n", err)
		return exitError
	}

	nc, err := nats.Connect(c.natsURL, nats.Name("jetflow-producer"), nats.Timeout(5*time.Second))
	if err != nil {
		fmt.Fprintf(stderr, "error: connect to %s: %v (is a worker or NATS server running?)\n", c.natsURL, err)
		return exitError
	}
	defer nc.Close()
	setupCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	client, err := jetflow.NewClient(setupCtx, nc, jetflow.ClientConfig{Name: "producer"})
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}

	out := &printer{w: stdout, json: c.output == "json"}
	switch c.command {
	case "start":
		err = start(ctx, client, out, c.args[0], c.args[1], c.id)
	case "get":
		err = get(ctx, client, out, c.args[0])
	case "wait":
		err = wait(ctx, client, out, c.args[0], c.timeout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
	}
	return exitCode(err)
}

func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, jetflow.ErrRunNotFound):
		return exitNotFound
	case errors.Is(err, jetflow.ErrRunFailed):
		return exitRunFailed
	default:
		return exitError
	}
}

// parseArgs accepts flags before, between and after the positional
// arguments, and checks the command's arity.
func parseArgs(args []string, getenv func(string) string) (cli, error) {
	c := cli{}
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defaultURL := getenv("JETFLOW_NATS_URL")
	if defaultURL == "" {
		defaultURL = "nats://127.0.0.1:4222"
	}
	fs.StringVar(&c.natsURL, "nats-url", defaultURL, "")
	fs.StringVar(&c.output, "output", "text", "")
	fs.StringVar(&c.id, "id", "", "")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "")

	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return cli{}, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) == 0 {
		return cli{}, errors.New("no command given")
	}
	c.command, c.args = pos[0], pos[1:]

	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	want := map[string]int{"start": 2, "get": 1, "wait": 1}
	n, ok := want[c.command]
	switch {
	case !ok:
		return cli{}, fmt.Errorf("unknown command %q: want start, get or wait", c.command)
	case len(c.args) != n && c.command == "start":
		return cli{}, errors.New("start takes a workflow name and a JSON input: producer start <workflow> <json-input> [--id RUNID]")
	case len(c.args) != n:
		return cli{}, fmt.Errorf("%s takes one run ID: producer %s <run-id>", c.command, c.command)
	case given["id"] && c.command != "start":
		return cli{}, fmt.Errorf("--id is a flag of start, not %s", c.command)
	case given["timeout"] && c.command != "wait":
		return cli{}, fmt.Errorf("--timeout is a flag of wait, not %s", c.command)
	case c.output != "text" && c.output != "json":
		return cli{}, fmt.Errorf("invalid value %q for --output: want text or json", c.output)
	case c.timeout <= 0:
		return cli{}, fmt.Errorf("invalid value %s for --timeout: must be positive", c.timeout)
	}
	return c, nil
}
