package workermain

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	conf "github.com/jetflow/jetflow/internal/server/config"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// parseConfig parses as a worker command without options does.
func parseConfig(args []string, getenv func(string) string, stderrIsTerminal bool, stdout, usage io.Writer) (config, error) {
	return newProgram(nil).parseConfig(args, getenv, stderrIsTerminal, stdout, usage)
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestParseConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{
		DataDir: "./jetflow-data", Host: "127.0.0.1", Port: 4222, Replicas: 1, DuplicateWindow: 2 * time.Minute, Concurrency: 64,
		AckWait: 30 * time.Second, DrainTimeout: 30 * time.Second, SweepInterval: time.Minute,
		OpsAddr: "127.0.0.1:8081", LogFormat: "json",
		LogLevel: zerolog.InfoLevel, Output: "text",
	}, c)
	require.True(t, c.embedded())

	c, err = parseConfig(nil, env(nil), true, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "console", c.LogFormat, "console on a terminal")
}

// --log-format, JETFLOW_LOG_FORMAT or the file's log-format force the
// format, on a terminal or not.
func TestParseConfigLogFormatOverride(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		vars     map[string]string
		terminal bool
		want     string
	}{
		{"flag json on a terminal", []string{"--log-format", "json"}, nil, true, "json"},
		{"env json on a terminal", nil, map[string]string{"JETFLOW_LOG_FORMAT": "json"}, true, "json"},
		{"file json on a terminal", []string{"--config", writeConfig(t, "log-format: json\n")}, nil, true, "json"},
		{"flag console off a terminal", []string{"--log-format", "console"}, nil, false, "console"},
		{"flag over env", []string{"--log-format", "console"}, map[string]string{"JETFLOW_LOG_FORMAT": "json"}, false, "console"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig(tc.args, env(tc.vars), tc.terminal, io.Discard, io.Discard)
			require.NoError(t, err)
			require.Equal(t, tc.want, c.LogFormat)
		})
	}
}

func TestParseConfigEnvFallback(t *testing.T) {
	t.Parallel()
	ca := testenv.GenerateCerts(t).CAFile
	vars := map[string]string{
		"JETFLOW_NATS_URL":             "nats://nats-1:4222",
		"JETFLOW_NATS_USER":            "app",
		"JETFLOW_NATS_PASSWORD":        "pw",
		"JETFLOW_NATS_TLS_CA":          ca,
		"JETFLOW_DATA_DIR":             "/var/lib/jetflow",
		"JETFLOW_PORT":                 "4333",
		"JETFLOW_REPLICAS":             "3",
		"JETFLOW_DUPLICATE_WINDOW":     "30s",
		"JETFLOW_CONCURRENCY":          "8",
		"JETFLOW_ACK_WAIT":             "10s",
		"JETFLOW_DRAIN_TIMEOUT":        "1m",
		"JETFLOW_SWEEP_INTERVAL":       "-1s",
		"JETFLOW_STUCK_AFTER":          "2m",
		"JETFLOW_BUILD":                "v2.1+rc1",
		"JETFLOW_CHECK_BEFORE_SERVING": "true",
		"JETFLOW_OPS_ADDR":             ":9090",
		"JETFLOW_SYNC_ALWAYS":          "true",
		"JETFLOW_LOG_FORMAT":           "console",
		"JETFLOW_LOG_LEVEL":            "debug",
	}
	c, err := parseConfig(nil, env(vars), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{
		NATS:    natsconn.Options{URL: "nats://nats-1:4222", User: "app", Password: "pw", TLSCA: ca},
		DataDir: "/var/lib/jetflow", Host: "127.0.0.1", Port: 4333, SyncAlways: true, Replicas: 3,
		DuplicateWindow: 30 * time.Second, Concurrency: 8, AckWait: 10 * time.Second, DrainTimeout: time.Minute, OpsAddr: ":9090",
		SweepInterval: -time.Second, StuckAfter: 2 * time.Minute, Build: "v2.1+rc1", CheckBeforeServing: true,
		LogFormat: "console", LogLevel: zerolog.DebugLevel, Output: "text",
	}, c)
	require.False(t, c.embedded())

	// A flag wins over the environment.
	c, err = parseConfig([]string{"--concurrency", "3", "--nats-url", "nats://other:4222", "--sync-always=false", "--ops-addr=",
		"--build", "v3", "--check-before-serving=false"},
		env(vars), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "v3", c.Build)
	require.False(t, c.CheckBeforeServing)
	require.Equal(t, 3, c.Concurrency)
	require.Equal(t, "nats://other:4222", c.NATS.URL)
	require.False(t, c.SyncAlways)
	require.Empty(t, c.OpsAddr, "empty disables the operations server")
	require.Equal(t, 10*time.Second, c.AckWait, "the rest still comes from the environment")
}

// TestParseConfigFilePrecedence: defaults < config file < environment <
// flags, with the file named by --config or JETFLOW_CONFIG.
func TestParseConfigFilePrecedence(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, `# worker settings
nats-url: nats://file:4222
concurrency: 16
ack-wait: 5s
drain-timeout: 7s
log-level: warn
build: release-7
check-before-serving: true
`)
	vars := map[string]string{"JETFLOW_ACK_WAIT": "9s", "JETFLOW_DRAIN_TIMEOUT": "8s"}
	c, err := parseConfig([]string{"--config", path, "--drain-timeout", "1s"}, env(vars), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "nats://file:4222", c.NATS.URL, "file over default")
	require.Equal(t, 16, c.Concurrency, "file over default")
	require.Equal(t, zerolog.WarnLevel, c.LogLevel, "file over default")
	require.Equal(t, 9*time.Second, c.AckWait, "environment over file")
	require.Equal(t, time.Second, c.DrainTimeout, "flag over environment and file")
	require.Equal(t, "./jetflow-data", c.DataDir, "default when nothing sets it")
	require.Equal(t, "release-7", c.Build, "file over default")
	require.True(t, c.CheckBeforeServing, "file over default")

	vars["JETFLOW_CONFIG"] = path
	c, err = parseConfig(nil, env(vars), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 16, c.Concurrency, "JETFLOW_CONFIG names the file")
}

func TestParseConfigRejectsBadValues(t *testing.T) {
	t.Parallel()
	badFile := writeConfig(t, "concurrency: 4\nack-wait: soon\n")
	unknownKey := writeConfig(t, "concurrency: 4\nack_wait: 1s\n")
	lowConcurrency := writeConfig(t, "concurrency: 0\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"BadEnvInt", nil, map[string]string{"JETFLOW_CONCURRENCY": "many"}, `invalid value "many" for --concurrency (from JETFLOW_CONCURRENCY)`},
		{"BadEnvDuration", nil, map[string]string{"JETFLOW_DRAIN_TIMEOUT": "30"}, `--drain-timeout (from JETFLOW_DRAIN_TIMEOUT)`},
		{"BadEnvBool", nil, map[string]string{"JETFLOW_SYNC_ALWAYS": "yes please"}, `--sync-always (from JETFLOW_SYNC_ALWAYS)`},
		{"BadFlagDuration", []string{"--ack-wait", "soon"}, nil, `invalid value "soon" for flag -ack-wait`},
		{"BadFileValue", []string{"--config", badFile}, nil, `invalid value "soon" for --ack-wait (from ` + badFile + ` line 2)`},
		{"UnknownFileKey", []string{"--config", unknownKey}, nil, `config file ` + unknownKey + ` line 2: key "ack_wait": unknown setting`},
		{"MissingFile", nil, map[string]string{"JETFLOW_CONFIG": "/nonexistent/worker.yaml"}, "config file /nonexistent/worker.yaml"},
		{"ZeroConcurrency", []string{"--concurrency", "0"}, nil, "invalid value 0 for --concurrency: must be at least 1"},
		{"ZeroConcurrencyFromFile", []string{"--config", lowConcurrency}, nil, "--concurrency (from " + lowConcurrency + " line 1): must be at least 1"},
		{"ShortAckWait", nil, map[string]string{"JETFLOW_ACK_WAIT": "10ms"}, "--ack-wait (from JETFLOW_ACK_WAIT): must be at least 100ms"},
		{"ShortSweepInterval", []string{"--sweep-interval", "1ms"}, nil, "invalid value 1ms for --sweep-interval: must be at least 10ms"},
		{"ShortStuckAfter", []string{"--ack-wait", "1m", "--stuck-after", "2m"}, nil, "invalid value 2m0s for --stuck-after: must be at least 3 × --ack-wait (3m0s)"},
		{"ShortDuplicateWindow", nil, map[string]string{"JETFLOW_DUPLICATE_WINDOW": "50ms"}, "invalid value 50ms for --duplicate-window (from JETFLOW_DUPLICATE_WINDOW): must be at least 100ms"},
		{"BadDuplicateWindow", []string{"--duplicate-window", "1 minute"}, nil, `invalid value "1 minute" for flag -duplicate-window`},
		{"NegativeDrain", []string{"--drain-timeout", "-1s"}, nil, "--drain-timeout: must be positive"},
		{"LogFormat", []string{"--log-format", "xml"}, nil, `invalid value "xml" for --log-format`},
		{"LogLevel", nil, map[string]string{"JETFLOW_LOG_LEVEL": "loud"}, `invalid value "loud" for --log-level (from JETFLOW_LOG_LEVEL)`},
		{"Port", []string{"--port", "70000"}, nil, "invalid value 70000 for --port"},
		{"EmptyDataDir", []string{"--data-dir", ""}, nil, "--data-dir: required"},
		{"StrayArgument", []string{"serve"}, nil, `unexpected argument "serve"`},
		{"Replicas", []string{"--nats-url", "nats://x:4222", "--replicas", "2"}, nil, "invalid value 2 for --replicas: want 1, or 3"},
		{"ReplicasEmbedded", []string{"--replicas", "3"}, nil, "invalid value 3 for --replicas: the embedded server is a single node"},
		{"OpsAddr", []string{"--ops-addr", "8081"}, nil, `invalid value "8081" for --ops-addr: want host:port`},
		{"OpsPort", []string{"--ops-addr", "127.0.0.1:http"}, nil, `invalid value "127.0.0.1:http" for --ops-addr: want a port number`},
		{"UserEmbedded", []string{"--nats-user", "app"}, map[string]string{"JETFLOW_NATS_PASSWORD": "pw"}, "--nats-user requires --nats-url: the embedded server"},
		{"TLSEmbedded", nil, map[string]string{"JETFLOW_NATS_TLS_CA": "ca.pem"}, "--nats-tls-ca (from JETFLOW_NATS_TLS_CA) requires --nats-url"},
		{"UserWithoutPassword", []string{"--nats-url", "nats://x:4222", "--nats-user", "app"}, nil, "invalid --nats-password: incomplete: required with --nats-user"},
		{"TokenAndUser", []string{"--nats-url", "nats://x:4222", "--nats-user", "app", "--nats-password", "pw", "--nats-token", "tok"}, nil, "invalid --nats-token: conflicting settings"},
		{"MissingCA", []string{"--nats-url", "nats://x:4222", "--nats-tls-ca", "/nonexistent/ca.pem"}, nil, "invalid --nats-tls-ca: unusable file"},
		{"BadURL", []string{"--nats-url", "http://x"}, nil, `invalid --nats-url: invalid URL: the URL has scheme "http"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			_, err := parseConfig(tc.args, env(tc.env), false, &out, io.Discard)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, out.String())
		})
	}
}

func TestParseConfigHelp(t *testing.T) {
	t.Parallel()
	var usage bytes.Buffer
	_, err := parseConfig([]string{"-h"}, env(nil), false, io.Discard, &usage)
	require.True(t, errors.Is(err, flag.ErrHelp))
	for _, want := range []string{"JETFLOW_<FLAG>", "\n  --config file\n", "\n  --print-config\n", "\n  --nats-password password\n",
		"\n  --nats-tls-ca file\n", "\n  --replicas int\n", "\n  --ops-addr address\n", "\n  --duplicate-window duration\n",
		"\n  --build string\n", "the binary's VCS revision", "\n  --check-before-serving\n",
		"worker check --nats-url URL [--build BUILD] [--output json] [flags]", "\n  --output string\n", "\n  3  check: the code would block",
		"Exit codes:\n  0  ", "\n  1  failed to start", "\n  2  a bad flag"} {
		require.Contains(t, usage.String(), want)
	}
	require.NotRegexp(t, `(?m)^\s+-[a-z]`, usage.String(), "one flag style: --flag")
	require.NotContains(t, usage.String(), "panic")
}

func TestParseConfigNatsURLSkipsEmbeddedChecks(t *testing.T) {
	t.Parallel()
	_, err := parseConfig([]string{"--nats-url", "nats://x:4222", "--data-dir", "", "--port", "0", "--replicas", "3"},
		env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
}

// TestPrintConfig: --print-config prints every setting with its origin,
// secrets redacted, and what it prints, fed back as --config (the secret
// from the environment), gives the same configuration.
func TestPrintConfig(t *testing.T) {
	t.Parallel()
	const password = "pr1nt-S3cret"
	file := writeConfig(t, "concurrency: 12\n")
	vars := map[string]string{"JETFLOW_NATS_PASSWORD": password, "JETFLOW_ACK_WAIT": "45s"}
	args := []string{"--print-config", "--config", file, "--nats-url", "nats://a:4222,nats://b:4222", "--nats-user", "app"}

	var out bytes.Buffer
	want, err := parseConfig(args, env(vars), false, &out, io.Discard)
	require.ErrorIs(t, err, errConfigPrinted)
	printed := out.String()
	require.NotContains(t, printed, password)
	for _, line := range []string{
		"ack-wait: 45s # env JETFLOW_ACK_WAIT\n",
		"concurrency: 12 # file " + file + "\n",
		"nats-password: <redacted> # env JETFLOW_NATS_PASSWORD\n",
		"nats-token: \"\" # default\n",
		"nats-url: nats://a:4222,nats://b:4222 # flag\n",
		"nats-user: app # flag\n",
		"ops-addr: 127.0.0.1:8081 # default\n",
		"replicas: 1 # default\n",
		"duplicate-window: 2m0s # default\n",
		"build: \"\" # default\n",
		"check-before-serving: false # default\n",
	} {
		require.Contains(t, printed, line)
	}
	require.NotContains(t, printed, "print-config")
	require.NotContains(t, printed, "\nconfig:")
	require.Equal(t, 26, strings.Count(printed, "\n"), "one line per setting:\n%s", printed)

	// Round trip: the printed file gives the same configuration.
	again := writeConfig(t, printed)
	got, err := parseConfig([]string{"--config", again}, env(map[string]string{"JETFLOW_NATS_PASSWORD": password}), false, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Without the secret, the placeholder is refused rather than sent.
	_, err = parseConfig([]string{"--config", again}, env(nil), false, io.Discard, io.Discard)
	require.ErrorIs(t, err, conf.ErrRedacted)
	require.ErrorContains(t, err, "--nats-password (from "+again)
}

// TestRunPrintConfig: the command prints to stdout and exits 0.
func TestRunPrintConfig(t *testing.T) {
	t.Parallel()
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer stderr.Close()
	var stdout bytes.Buffer
	code := Run(t.Context(), jetflow.NewRegistry(), []string{"--print-config", "--nats-url", "nats://x:4222", "--nats-token", "t0ken-S3cret"},
		WithEnv(env(nil)), WithOutput(&stdout, stderr))
	require.Equal(t, 0, code)
	require.Contains(t, stdout.String(), "nats-token: <redacted> # flag\n")
	require.NotContains(t, stdout.String(), "t0ken-S3cret")
	logged, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)
	require.Empty(t, logged)

	code = Run(t.Context(), jetflow.NewRegistry(), []string{"--print-config", "--replicas", "5"}, WithEnv(env(nil)), WithOutput(&stdout, stderr))
	require.Equal(t, ExitUsage, code, "an invalid configuration is not printed")
}

// TestPrintConfigRedactsURLCredentials: credentials written into
// --nats-url are not printed, from the environment or a flag.
func TestPrintConfigRedactsURLCredentials(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"nats://alice:s3cretpw@127.0.0.1:4222", "nats://tok3nvalue@127.0.0.1:4222,nats://b:4222"} {
		var out bytes.Buffer
		_, err := parseConfig([]string{"--print-config"}, env(map[string]string{"JETFLOW_NATS_URL": url}), false, &out, io.Discard)
		require.ErrorIs(t, err, errConfigPrinted)
		require.Contains(t, out.String(), "nats-url: ")
		for _, secret := range []string{"s3cretpw", "tok3nvalue"} {
			require.NotContains(t, out.String(), secret)
		}
	}
}

// WithName and WithDescription are the program's: its usage text and its
// error messages carry them.
func TestRunUsesTheProgramName(t *testing.T) {
	t.Parallel()
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer stderr.Close()
	var stdout bytes.Buffer
	opts := []Option{WithName("acme-worker"), WithDescription("Runs Acme's workflows."), WithEnv(env(nil)), WithOutput(&stdout, stderr)}
	require.Equal(t, 0, Run(t.Context(), jetflow.NewRegistry(), []string{"-h"}, opts...))
	require.Equal(t, ExitUsage, Run(t.Context(), jetflow.NewRegistry(), []string{"--replicas", "5"}, opts...))
	out, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)
	require.Contains(t, stdout.String()+string(out), "acme-worker")
	require.Contains(t, stdout.String()+string(out), "Runs Acme's workflows.")
	require.Contains(t, string(out), "acme-worker: ")
}

// TestRunUsageErrorsExit2: an unknown flag, a stray argument and a bad
// setting exit 2 (ExitUsage), as Go's flag package does, with the error on
// stderr.
func TestRunUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"serve"}, `unexpected argument "serve"`},
		{[]string{"--concurrency", "0"}, "invalid value 0 for --concurrency"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(t.Context(), jetflow.NewRegistry(), tc.args, WithEnv(env(nil)), WithOutput(&stdout, &stderr))
		require.Equal(t, ExitUsage, code, "%v", tc.args)
		require.Equal(t, 2, ExitUsage)
		require.Contains(t, stderr.String(), tc.want)
		require.Empty(t, stdout.String())
	}
}
