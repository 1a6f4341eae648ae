package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	conf "github.com/jetflow/jetflow/internal/server/config"
)

// runNoServer runs the producer with vars as its whole environment.
func runNoServer(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return vars[k] }, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestPrintConfig(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "producer.yaml", strings.Join([]string{
		"nats-user: alice",
		"nats-password: pw-from-file-9f2c",
		"output: json",
		"replicas: 3",
		"http-addr: 127.0.0.1:9999",
		"request-timeout: 3s",
	}, "\n"))
	vars := map[string]string{
		"JETFLOW_CONFIG":    file,
		"JETFLOW_OUTPUT":    "text",       // the environment beats the file
		"JETFLOW_HTTP_ADDR": "0.0.0.0:80", // the flag beats the environment
		"JETFLOW_API_TOKEN": "tok-from-env-77aa,tok-two-88bb",
		"JETFLOW_ID":        "ignored",
	}
	code, out, errOut := runNoServer(t, vars, "--print-config", "--http-addr", "127.0.0.1:7000", "--id", "evt_1", "start", "greet", "{}")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)

	for _, secret := range []string{"pw-from-file-9f2c", "tok-from-env-77aa", "tok-two-88bb"} {
		require.NotContains(t, out, secret)
	}
	for _, line := range []string{
		"api-token: <redacted> # env JETFLOW_API_TOKEN",
		"nats-password: <redacted> # file " + file,
		"nats-token: \"\" # default",
		"nats-user: alice # file " + file,
		"nats-url: nats://127.0.0.1:4222 # default",
		"output: text # env JETFLOW_OUTPUT",
		"replicas: 3 # file " + file,
		"http-addr: 127.0.0.1:7000 # flag",
		"request-timeout: 3s # file " + file,
		"log-level: info # default",
		"webhooks: \"\" # default",
	} {
		require.Contains(t, out, line+"\n")
	}
	// Command-line-only flags are not settings.
	for _, name := range invocationFlags {
		require.NotRegexp(t, regexp.MustCompile(`(?m)^`+name+`:`), out)
	}

	// The printed settings read back as a config file, except the
	// redacted secrets, which must be given again.
	printed := writeFile(t, "printed.yaml", out)
	code, _, errOut = runNoServer(t, nil, "--config", printed, "--print-config")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, conf.Redacted+" is the placeholder")
	require.NotContains(t, errOut, "tok-from-env-77aa")
}

// TestPrintConfigURLCredentials: a password or token written into the
// server URL is not printed either.
func TestPrintConfigURLCredentials(t *testing.T) {
	t.Parallel()
	code, out, errOut := runNoServer(t, map[string]string{"JETFLOW_NATS_URL": "nats://bob:url-pw-61d0@nats-1:4222,nats://tok-in-url-3e2a@nats-2:4222"}, "--print-config")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "url-pw-61d0")
	require.NotContains(t, out, "tok-in-url-3e2a")
	require.Contains(t, out, "nats-url: ")
	require.Contains(t, out, "nats-1:4222")
	require.Contains(t, out, "# env JETFLOW_NATS_URL\n")
}

func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "producer.yaml", "output: json\nlimit: 3\n")
	// limit is command-line only: a file naming it is an error.
	code, _, errOut := runNoServer(t, nil, "--config", file, "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `key "limit": not allowed in a config file`)

	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want conf.Source
		out  string
	}{
		{"Default", nil, nil, conf.FromDefault, "text"},
		{"File", map[string]string{"JETFLOW_CONFIG": writeFile(t, "a.yaml", "output: json\n")}, nil, conf.FromFile, "json"},
		{"EnvOverFile", map[string]string{"JETFLOW_CONFIG": writeFile(t, "b.yaml", "output: json\n"), "JETFLOW_OUTPUT": "text"}, nil, conf.FromEnv, "text"},
		{"FlagOverEnv", map[string]string{"JETFLOW_OUTPUT": "text"}, []string{"--output", "json"}, conf.FromFlag, "json"},
		{"FlagConfigOverEnvConfig", map[string]string{"JETFLOW_CONFIG": "/nonexistent"}, []string{"--config", writeFile(t, "c.yaml", "output: json\n")}, conf.FromFile, "json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout bytes.Buffer
			c, err := parseArgs(append(tc.args, "get", "r-1"), func(k string) string { return tc.vars[k] }, false, &stdout)
			require.NoError(t, err)
			require.Equal(t, tc.out, c.output)
			require.Equal(t, []string{"r-1"}, c.args)

			// The same through --print-config.
			_, err = parseArgs(append(tc.args, "--print-config"), func(k string) string { return tc.vars[k] }, false, &stdout)
			require.ErrorIs(t, err, errConfigPrinted)
			require.Regexp(t, `(?m)^output: `+tc.out+` # `+map[conf.Source]string{
				conf.FromDefault: "default", conf.FromFile: "file", conf.FromEnv: "env", conf.FromFlag: "flag",
			}[tc.want], stdout.String())
		})
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"BadEnvOutput", map[string]string{"JETFLOW_OUTPUT": "yaml"}, []string{"list"},
			`error: invalid value "yaml" for --output (from JETFLOW_OUTPUT): want text or json`},
		{"BadEnvTimeout", map[string]string{"JETFLOW_REQUEST_TIMEOUT": "soon"}, []string{"serve"},
			`invalid value "soon" for --request-timeout (from JETFLOW_REQUEST_TIMEOUT)`},
		{"BadLogFormat", nil, []string{"serve", "--log-format", "xml"}, `invalid value "xml" for --log-format: want json or console`},
		{"BadLogLevel", map[string]string{"JETFLOW_LOG_LEVEL": "loud"}, []string{"serve"}, `invalid value "loud" for --log-level (from JETFLOW_LOG_LEVEL)`},
		{"BadHTTPAddr", nil, []string{"serve", "--http-addr", "8080"}, `invalid value "8080" for --http-addr: want host:port`},
		{"EmptyToken", map[string]string{"JETFLOW_API_TOKEN": "s3cr3t-a,,s3cr3t-b"}, []string{"serve"},
			"invalid value for --api-token (from JETFLOW_API_TOKEN): token 2 of the comma-separated list is empty"},
		{"PasswordWithoutUser", map[string]string{"JETFLOW_NATS_PASSWORD": "s3cr3t-pw"}, []string{"list"}, "invalid --nats-user: incomplete: required with --nats-password"},
		{"UnknownFileKey", map[string]string{"JETFLOW_CONFIG": "FILE"}, []string{"list"}, `key "nats-ur": unknown setting`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.vars["JETFLOW_CONFIG"] == "FILE" {
				tc.vars["JETFLOW_CONFIG"] = writeFile(t, "bad.yaml", "nats-ur: nats://x:4222\n")
			}
			code, out, errOut := runNoServer(t, tc.vars, tc.args...)
			require.Equal(t, 1, code, errOut)
			require.Empty(t, out)
			require.Contains(t, errOut, tc.want)
			require.NotContains(t, errOut, "s3cr3t")
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
}

// serve logs in console format on a terminal and JSON lines otherwise,
// unless --log-format or JETFLOW_LOG_FORMAT says which.
func TestServeLogFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		vars     map[string]string
		terminal bool
		want     string
	}{
		{"pipe", nil, nil, false, "json"},
		{"terminal", nil, nil, true, "console"},
		{"flag json on a terminal", []string{"--log-format", "json"}, nil, true, "json"},
		{"env json on a terminal", nil, map[string]string{"JETFLOW_LOG_FORMAT": "json"}, true, "json"},
		{"flag console off a terminal", []string{"--log-format", "console"}, nil, false, "console"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseArgs(append([]string{"serve"}, tc.args...), func(k string) string { return tc.vars[k] }, tc.terminal, &bytes.Buffer{})
			require.NoError(t, err)
			require.Equal(t, tc.want, c.serve.logFormat)
		})
	}
}

func TestSplitArgs(t *testing.T) {
	t.Parallel()
	c, err := parseArgs([]string{"--output=json", "start", "--id", "evt_1", "greet", "--print-config=false", "--", "-1"},
		nil, false, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, "start", c.command)
	require.Equal(t, []string{"greet", "-1"}, c.args)
	require.Equal(t, "evt_1", c.id)
	require.Equal(t, "json", c.output)

	_, err = parseArgs([]string{"get", "r", "--nope"}, nil, false, &bytes.Buffer{})
	require.EqualError(t, err, "flag provided but not defined: -nope")
	_, err = parseArgs([]string{"get", "r", "--timeout"}, nil, false, &bytes.Buffer{})
	require.EqualError(t, err, "flag needs an argument: -timeout")
	_, err = parseArgs([]string{"get", "--help"}, nil, false, &bytes.Buffer{})
	require.ErrorIs(t, err, flag.ErrHelp)
}

// TestUsageNamesEveryFlag keeps the usage text in step with the flags.
func TestUsageNamesEveryFlag(t *testing.T) {
	t.Parallel()
	var stdout bytes.Buffer
	_, err := parseArgs([]string{"--print-config"}, nil, false, &stdout)
	require.ErrorIs(t, err, errConfigPrinted)
	names := append([]string{conf.FileFlag}, invocationFlags...)
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		names = append(names, strings.SplitN(line, ":", 2)[0])
	}
	require.Greater(t, len(names), 20)
	for _, name := range names {
		require.Contains(t, usage, "--"+name+" ", "usage text lacks --%s", name)
	}
	for _, code := range []string{"0  success", "1  usage", "2  wait", "3  not found", "4  conflict", "5  unavailable", "6  engine", "7  engine"} {
		require.Contains(t, usage, code)
	}
}
