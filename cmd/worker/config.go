package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// config is the worker's configuration. Every flag falls back to an
// environment variable named after it: --ack-wait reads JETFLOW_ACK_WAIT.
// A flag given on the command line wins over the environment.
type config struct {
	NatsURL      string
	DataDir      string
	Host         string
	Port         int
	SyncAlways   bool
	Concurrency  int
	AckWait      time.Duration
	DrainTimeout time.Duration
	LogFormat    string
	LogLevel     zerolog.Level
	PaymentsAddr string
	FlakyCharge  bool
}

// embedded reports whether the worker runs its own NATS server.
func (c config) embedded() bool { return c.NatsURL == "" }

// envName is the environment variable a flag falls back to.
func envName(flagName string) string {
	return "JETFLOW_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseConfig reads args (without the program name), then the environment
// through getenv for every flag not given. stderrIsTerminal picks the
// default log format. A bad value is reported with the flag's name.
func parseConfig(args []string, getenv func(string) string, stderrIsTerminal bool, usage io.Writer) (config, error) {
	var (
		c        config
		logLevel string
	)
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&c.NatsURL, "nats-url", "", "NATS server to connect to; empty starts an embedded server")
	fs.StringVar(&c.DataDir, "data-dir", "./jetflow-data", "embedded server: JetStream file store directory")
	fs.StringVar(&c.Host, "host", "127.0.0.1", "embedded server: address to listen on")
	fs.IntVar(&c.Port, "port", 4222, "embedded server: port to listen on (-1 for a random one)")
	fs.BoolVar(&c.SyncAlways, "sync-always", false, "embedded server: fsync every write (survives an OS crash, much slower)")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "how many steps run at once")
	fs.DurationVar(&c.AckWait, "ack-wait", 30*time.Second, "how long before a crashed worker's step is redelivered")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long running steps may take to finish")
	fs.StringVar(&c.LogFormat, "log-format", "", "json or console (default console on a terminal, json otherwise)")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	fs.StringVar(&c.PaymentsAddr, "payments-addr", "127.0.0.1:0", "example payment service: address to listen on")
	fs.BoolVar(&c.FlakyCharge, "flaky-charge", false, "example order workflow: lose the payment service's first response, to show a safe retry")
	fs.Usage = func() {
		fmt.Fprintf(usage, "Usage: worker [flags]\n\nRuns the jetflow example workflows. Every flag falls back to JETFLOW_<FLAG>, e.g. JETFLOW_NATS_URL.\n\n")
		fs.PrintDefaults()
	}

	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || envErr != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("invalid value %q for --%s (from %s): %w", v, f.Name, envName(f.Name), err)
			}
		}
	})
	if envErr != nil {
		return config{}, envErr
	}

	if c.LogFormat == "" {
		c.LogFormat = "json"
		if stderrIsTerminal {
			c.LogFormat = "console"
		}
	}
	lvl, err := zerolog.ParseLevel(logLevel)
	if err != nil || logLevel == "" {
		return config{}, fmt.Errorf("invalid value %q for --log-level: want trace, debug, info, warn or error", logLevel)
	}
	c.LogLevel = lvl
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.LogFormat != "json" && c.LogFormat != "console":
		return fmt.Errorf("invalid value %q for --log-format: want json or console", c.LogFormat)
	case c.Concurrency < 1:
		return fmt.Errorf("invalid value %d for --concurrency: must be at least 1", c.Concurrency)
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("invalid value %s for --ack-wait: must be at least 100ms", c.AckWait)
	case c.DrainTimeout <= 0:
		return fmt.Errorf("invalid value %s for --drain-timeout: must be positive", c.DrainTimeout)
	case c.embedded() && c.DataDir == "":
		return errors.New("invalid value \"\" for --data-dir: required when --nats-url is not set")
	case c.embedded() && (c.Port < -1 || c.Port == 0 || c.Port > 65535):
		return fmt.Errorf("invalid value %d for --port: want 1..65535, or -1 for a random port", c.Port)
	}
	return nil
}
