package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/logging"
	conf "github.com/jetflow/jetflow/internal/server/config"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

// errConfigPrinted is parseArgs's answer to --print-config: the settings
// were printed and the producer should exit without doing anything else.
var errConfigPrinted = errors.New("configuration printed")

// cli is a parsed command line with its settings.
type cli struct {
	// Settings: the command line, else JETFLOW_<FLAG>, else the config file.
	nats     natsconn.Options
	replicas int
	output   string
	serve    serveConfig

	// The invocation: command line only.
	command string
	args    []string
	id      string
	// idGiven: --id was on the command line, even as --id "".
	idGiven    bool
	generateID bool
	timeout    time.Duration
	workflow   string
	status     string
	limit      int
	cursor     string
	// list: the run ID prefix, the time window (RFC 3339), --counts.
	prefix       string
	since, until time.Time
	counts       bool
	// start and list: --attr name=value, repeatable.
	attrs attrsFlag
	// watch: how often it reads the run again while nothing ends it.
	interval time.Duration
	scope    jetflow.KeyScope
	runID    string
	// send and resume (events.go): the event ID and the JSON payload.
	eventID string
	data    string
	// unblock: waive the history's step the block names.
	acceptDivergence bool
	// rerun: the first step to run again, and a plan only.
	from   string
	dryRun bool
}

// serveConfig holds the settings of producer serve.
type serveConfig struct {
	httpAddr       string
	opsAddr        string // "" serves the operations endpoints on httpAddr
	tokens         []string
	webhooks       string
	requestTimeout time.Duration
	logFormat      string
	logLevel       zerolog.Level
}

// arity is how many positional arguments each command takes, and its
// synopsis for an error about them.
var arity = map[string]struct {
	n        int
	synopsis string
}{
	"start":   {2, "start takes a workflow name and a JSON input: producer start <workflow> <json-input> --id RUNID|--generate-id [--attr NAME=VALUE]..."},
	"get":     {1, "get takes one run ID: producer get <run-id>"},
	"wait":    {1, "wait takes one run ID: producer wait <run-id>"},
	"watch":   {1, "watch takes one run ID: producer watch <run-id> [--interval 1s] [--timeout 60s]"},
	"cancel":  {1, "cancel takes one run ID: producer cancel <run-id>"},
	"unblock": {1, "unblock takes one run ID: producer unblock <run-id> [--accept-divergence]"},
	"rerun":   {1, "rerun takes one run ID: producer rerun <run-id> [--from STEP] [--id RUNID] [--dry-run]"},
	"list":    {0, "list takes no arguments: producer list [--workflow W] [--status S] [--prefix P] [--attr NAME=VALUE]... [--since T] [--until T] [--limit N] [--cursor C] | --counts [--workflow W]"},
	"reset":   {1, "reset takes one key: producer reset <key> --scope global|workflow|run [--workflow W | --run-id R]"},
	"send":    {2, "send takes a run ID and an event name: producer send <run-id> <event-name> --event-id ID [--data JSON]"},
	"resume":  {1, "resume takes one hook token: producer resume <token> --event-id ID [--data JSON]"},
	"workers": {0, "workers takes no arguments: producer workers"},
	"engine":  {0, "engine takes no arguments: producer engine"},
	"serve":   {0, "serve takes no arguments: producer serve [--http-addr ADDR] [--api-token T] [--webhooks FILE]"},
}

// commandFlags are the flags only some commands take. Given on the command
// line to another command they are an error; settings among them read from
// the environment or a config file are ignored by the other commands.
var commandFlags = map[string][]string{
	"id":                {"start", "rerun"},
	"generate-id":       {"start"},
	"timeout":           {"wait", "watch"},
	"workflow":          {"list", "reset"},
	"status":            {"list"},
	"limit":             {"list"},
	"cursor":            {"list"},
	"prefix":            {"list"},
	"attr":              {"start", "list"},
	"since":             {"list"},
	"until":             {"list"},
	"counts":            {"list"},
	"interval":          {"watch"},
	"scope":             {"reset"},
	"run-id":            {"reset"},
	"event-id":          {"send", "resume"},
	"data":              {"send", "resume"},
	"accept-divergence": {"unblock"},
	"from":              {"rerun"},
	"dry-run":           {"rerun"},
	"http-addr":         {"serve"},
	"ops-addr":          {"serve"},
	"api-token":         {"serve"},
	"webhooks":          {"serve"},
	"request-timeout":   {"serve"},
	"log-format":        {"serve"},
	"log-level":         {"serve"},
}

// invocationFlags are read from the command line only: a stray JETFLOW_ID
// must not make every start reuse one run ID.
var invocationFlags = []string{"id", "generate-id", "timeout", "workflow", "status", "limit", "cursor",
	"prefix", "attr", "since", "until", "counts", "interval", "scope", "run-id", "event-id", "data", "accept-divergence", "from", "dry-run", "print-config"}

// parseArgs reads args (without the program name), the environment through
// getenv and the config file. Flags may come before, between and after the
// positional arguments; "--" ends the flags. It checks the command's
// arguments and flags. stderrIsTerminal picks serve's default log format.
// With --print-config it prints the settings to stdout and returns
// errConfigPrinted, whatever the command. A bad value is reported with its
// flag's name and, when it did not come from the command line, its origin.
func parseArgs(args []string, getenv func(string) string, stderrIsTerminal bool, stdout io.Writer) (cli, error) {
	c := cli{nats: natsconn.Options{URL: "nats://127.0.0.1:4222"}}
	var (
		scope, tokens, logLevel string
		since, until            string
		printConfig             bool
	)
	fs := flag.NewFlagSet("producer", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // run prints the usage text for -h
	natsconn.Register(fs, &c.nats)
	fs.IntVar(&c.replicas, "replicas", 1, "")
	fs.StringVar(&c.output, "output", "text", "")
	fs.String(conf.FileFlag, "", "")
	fs.BoolVar(&printConfig, "print-config", false, "")
	fs.StringVar(&c.id, "id", "", "")
	fs.BoolVar(&c.generateID, "generate-id", false, "")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "")
	fs.StringVar(&c.workflow, "workflow", "", "")
	fs.StringVar(&c.status, "status", "", "")
	fs.IntVar(&c.limit, "limit", jetflow.DefaultListLimit, "")
	fs.StringVar(&c.cursor, "cursor", "", "")
	fs.StringVar(&c.prefix, "prefix", "", "")
	fs.Var(&c.attrs, "attr", "")
	fs.StringVar(&since, "since", "", "")
	fs.StringVar(&until, "until", "", "")
	fs.BoolVar(&c.counts, "counts", false, "")
	fs.DurationVar(&c.interval, "interval", time.Second, "")
	fs.StringVar(&scope, "scope", "", "")
	fs.StringVar(&c.runID, "run-id", "", "")
	fs.StringVar(&c.eventID, "event-id", "", "")
	fs.StringVar(&c.data, "data", "", "")
	fs.BoolVar(&c.acceptDivergence, "accept-divergence", false, "")
	fs.StringVar(&c.from, "from", "", "")
	fs.BoolVar(&c.dryRun, "dry-run", false, "")
	fs.StringVar(&c.serve.httpAddr, "http-addr", "127.0.0.1:8080", "")
	fs.StringVar(&c.serve.opsAddr, "ops-addr", "", "")
	fs.StringVar(&tokens, "api-token", "", "")
	fs.StringVar(&c.serve.webhooks, "webhooks", "", "")
	fs.DurationVar(&c.serve.requestTimeout, "request-timeout", 10*time.Second, "")
	fs.StringVar(&c.serve.logFormat, "log-format", "", "")
	fs.StringVar(&logLevel, "log-level", "info", "")
	conf.Secret(fs, "api-token") // natsconn.Register marks its own secrets
	conf.CommandLineOnly(fs, invocationFlags...)

	flagArgs, pos := splitArgs(fs, args)
	origins, err := conf.Load(fs, flagArgs, getenv)
	if err != nil {
		return cli{}, err
	}
	if err := c.settings(origins, tokens, logLevel, stderrIsTerminal); err != nil {
		return cli{}, err
	}
	if printConfig {
		if err := conf.Print(stdout, fs, origins); err != nil {
			return cli{}, fmt.Errorf("print config: %w", err)
		}
		return cli{}, errConfigPrinted
	}

	if len(pos) == 0 {
		return cli{}, errors.New("no command given")
	}
	c.command, c.args = pos[0], pos[1:]
	a, ok := arity[c.command]
	switch {
	case !ok:
		return cli{}, fmt.Errorf("unknown command %q: want start, get, watch, wait, cancel, unblock, send, resume, list, reset, workers, engine or serve", c.command)
	case len(c.args) != a.n:
		return cli{}, errors.New(a.synopsis)
	}
	var misplaced error
	fs.VisitAll(func(f *flag.Flag) {
		if origins[f.Name].Source != conf.FromFlag || misplaced != nil {
			return
		}
		if cmds, only := commandFlags[f.Name]; only && !slices.Contains(cmds, c.command) {
			misplaced = fmt.Errorf("--%s is a flag of %s, not %s", f.Name, strings.Join(cmds, " and "), c.command)
		}
	})
	if misplaced != nil {
		return cli{}, misplaced
	}
	c.idGiven = origins["id"].Source == conf.FromFlag
	if err := c.listWindow(since, until, origins); err != nil {
		return cli{}, err
	}
	if err := c.invocation(scope); err != nil {
		return cli{}, err
	}
	return c, nil
}

// splitArgs separates flags (with their values) from positional arguments,
// so that flags may come anywhere on the line. Everything after "--" is
// positional. A flag fs does not know is passed on for Load to report.
func splitArgs(fs *flag.FlagSet, args []string) (flags, pos []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return flags, append(pos, args[i+1:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil || isBool(f) || i+1 == len(args) {
			continue
		}
		flags = append(flags, args[i+1])
		i++
	}
	return flags, pos
}

// isBool reports whether f takes no value (--print-config).
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// settings checks the settings, which may come from the environment or the
// config file, and fills in the parsed ones.
func (c *cli) settings(o conf.Origins, tokens, logLevel string, stderrIsTerminal bool) error {
	switch {
	case c.output != "text" && c.output != "json":
		return fmt.Errorf("invalid value %q for %s: want text or json", c.output, o.Flag("output"))
	case c.replicas != 1 && c.replicas != 3:
		return fmt.Errorf("invalid value %d for %s: want 1, or 3 on a three-node cluster", c.replicas, o.Flag("replicas"))
	case c.serve.requestTimeout <= 0:
		return fmt.Errorf("invalid value %s for %s: must be positive", c.serve.requestTimeout, o.Flag("request-timeout"))
	}
	c.serve.logFormat = logging.ChooseFormat(c.serve.logFormat, stderrIsTerminal)
	if c.serve.logFormat != "json" && c.serve.logFormat != "console" {
		return fmt.Errorf("invalid value %q for %s: want json or console", c.serve.logFormat, o.Flag("log-format"))
	}
	lvl, err := zerolog.ParseLevel(logLevel)
	if err != nil || logLevel == "" {
		return fmt.Errorf("invalid value %q for %s: want trace, debug, info, warn or error", logLevel, o.Flag("log-level"))
	}
	c.serve.logLevel = lvl
	if err := opshttp.CheckAddr(c.serve.httpAddr); err != nil {
		return fmt.Errorf("invalid value %q for %s: %w", c.serve.httpAddr, o.Flag("http-addr"), err)
	}
	if c.serve.opsAddr != "" {
		if err := opshttp.CheckAddr(c.serve.opsAddr); err != nil {
			return fmt.Errorf("invalid value %q for %s: %w, or empty to use --http-addr", c.serve.opsAddr, o.Flag("ops-addr"), err)
		}
	}
	if c.serve.tokens, err = splitTokens(tokens); err != nil {
		// Never the value: it is a secret.
		return fmt.Errorf("invalid value for %s: %w", o.Flag("api-token"), err)
	}
	return c.nats.Validate()
}

// splitTokens splits the comma-separated --api-token into its tokens; ""
// is none. An empty token in a list is an error.
func splitTokens(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	tokens := strings.Split(s, ",")
	for i, t := range tokens {
		tokens[i] = strings.TrimSpace(t)
		if tokens[i] == "" {
			return nil, fmt.Errorf("token %d of the comma-separated list is empty", i+1)
		}
	}
	return tokens, nil
}

// invocation checks the command-line-only flags of the command.
func (c *cli) invocation(scope string) error {
	switch {
	case c.timeout <= 0:
		return fmt.Errorf("invalid value %s for --timeout: must be positive", c.timeout)
	case c.interval <= 0:
		return fmt.Errorf("invalid value %s for --interval: must be positive", c.interval)
	case c.limit < 1 || c.limit > jetflow.MaxListLimit:
		// 0 is not "the default": the default is what the flag starts
		// with, and a --limit 0 from a script is a mistake to report.
		return fmt.Errorf("invalid value %d for --limit: want 1..%d", c.limit, jetflow.MaxListLimit)
	case c.status != "" && !slices.Contains([]jetflow.RunStatus{
		jetflow.StatusRunning, jetflow.StatusBlocked, jetflow.StatusCompleted, jetflow.StatusFailed, jetflow.StatusCancelled,
	}, jetflow.RunStatus(c.status)):
		return fmt.Errorf("invalid value %q for --status: want running, blocked, completed, failed or cancelled", c.status)
	}
	switch c.command {
	case "start":
		return c.checkStartID()
	case "send", "resume":
		return c.checkEventID()
	}
	if c.command != "reset" {
		return nil
	}
	switch scope {
	case "global":
		c.scope = jetflow.ScopeGlobal
		if c.workflow != "" || c.runID != "" {
			return errors.New("--scope global takes neither --workflow nor --run-id")
		}
	case "workflow":
		c.scope = jetflow.ScopeWorkflow
		if c.workflow == "" || c.runID != "" {
			return errors.New("--scope workflow needs --workflow W and no --run-id")
		}
	case "run":
		c.scope = jetflow.ScopeRun
		if c.runID == "" || c.workflow != "" {
			return errors.New("--scope run needs --run-id R and no --workflow")
		}
	case "":
		return errors.New("reset needs --scope global, workflow or run")
	default:
		return fmt.Errorf("invalid value %q for --scope: want global, workflow or run", scope)
	}
	return nil
}

// listWindow reads list's --since and --until (RFC 3339 times) and checks
// that --counts comes with no flag of list but --workflow.
func (c *cli) listWindow(since, until string, o conf.Origins) error {
	for _, t := range []struct {
		name, v string
		to      *time.Time
	}{{"since", since, &c.since}, {"until", until, &c.until}} {
		if t.v == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.v)
		if err != nil {
			return fmt.Errorf("invalid value %q for --%s: want an RFC 3339 time such as 2026-01-02T15:04:05Z", t.v, t.name)
		}
		*t.to = v
	}
	if !c.since.IsZero() && !c.until.IsZero() && !c.since.Before(c.until) {
		return fmt.Errorf("--since %s is not before --until %s", since, until)
	}
	if !c.counts {
		return nil
	}
	for _, name := range []string{"status", "prefix", "attr", "since", "until", "limit", "cursor"} {
		if o[name].Source == conf.FromFlag {
			return fmt.Errorf("--counts takes no --%s (only --workflow)", name)
		}
	}
	return nil
}

// checkStartID checks start's run ID flags: --id with a run ID, or
// --generate-id, never both and never neither. An empty --id (a script's
// unset variable) is an error, not a request for a generated ID, so that
// retrying the script cannot start a new run each time.
func (c *cli) checkStartID() error {
	switch {
	case c.idGiven && c.generateID:
		return errors.New("--id and --generate-id exclude each other")
	case c.generateID:
		return nil
	case c.idGiven && c.id == "":
		return errors.New("--id is empty: give the run ID (your idempotency key), or --generate-id for a new run each time")
	case !c.idGiven:
		return errors.New("start needs --id RUNID (your idempotency key, the same on every retry), or --generate-id for a new run each time")
	}
	return nil
}

// listOptions is the page list asks for.
func (c cli) listOptions() jetflow.ListOptions {
	return jetflow.ListOptions{
		Workflow: c.workflow, Status: jetflow.RunStatus(c.status), RunIDPrefix: c.prefix,
		Since: c.since, Until: c.until, After: c.cursor, Limit: c.limit, Attributes: c.attrs,
	}
}

// attrsFlag is --attr NAME=VALUE, repeatable: a run's attributes (start)
// or the attributes runs must have (list). The value is everything after
// the first "="; jetflow checks names and values (ErrInvalidAttributes).
type attrsFlag map[string]string

func (a *attrsFlag) String() string {
	if a == nil || len(*a) == 0 {
		return ""
	}
	parts := make([]string, 0, len(*a))
	for _, name := range slices.Sorted(maps.Keys(*a)) {
		parts = append(parts, name+"="+(*a)[name])
	}
	return strings.Join(parts, ",")
}

func (a *attrsFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want NAME=VALUE, such as order_id=42")
	}
	if _, dup := (*a)[name]; dup {
		return fmt.Errorf("attribute %s given twice", name)
	}
	if *a == nil {
		*a = attrsFlag{}
	}
	(*a)[name] = value
	return nil
}

// scopeID is the ID of reset's scope: the workflow, the run ID, or "" for
// the global scope.
func (c cli) scopeID() string {
	switch c.scope {
	case jetflow.ScopeWorkflow:
		return c.workflow
	case jetflow.ScopeRun:
		return c.runID
	}
	return ""
}
