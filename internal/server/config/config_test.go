package config_test

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

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/server/config"
)

// settings is a command's flags, as a test bundle.
type settings struct {
	fs          *flag.FlagSet
	URL         string
	Password    string
	Concurrency int
	AckWait     time.Duration
	Sync        bool
	PrintConfig bool
}

func newSettings() *settings {
	s := &settings{fs: flag.NewFlagSet("test", flag.ContinueOnError)}
	s.fs.SetOutput(io.Discard)
	s.fs.StringVar(&s.URL, "nats-url", "nats://127.0.0.1:4222", "server")
	s.fs.StringVar(&s.Password, "nats-password", "", "password")
	s.fs.IntVar(&s.Concurrency, "concurrency", 64, "steps at once")
	s.fs.DurationVar(&s.AckWait, "ack-wait", 30*time.Second, "ack wait")
	s.fs.BoolVar(&s.Sync, "sync-always", false, "fsync")
	s.fs.BoolVar(&s.PrintConfig, "print-config", false, "print and exit")
	config.Secret(s.fs, "nats-password")
	config.CommandLineOnly(s.fs, "print-config")
	return s
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	require.Equal(t, "JETFLOW_ACK_WAIT", config.EnvName("ack-wait"))
	require.Equal(t, "JETFLOW_CONFIG", config.EnvName(config.FileFlag))
}

func TestLoadPrecedence(t *testing.T) {
	t.Parallel()
	const file = "concurrency: 8\nack-wait: 5s\nnats-url: nats://file:4222\n"
	for _, tc := range []struct {
		name        string
		args        []string
		env         map[string]string
		file        string // written to a file named by --config when set
		concurrency int
		origin      config.Origin
		ackWait     time.Duration
	}{
		{name: "Default", concurrency: 64, origin: config.Origin{Source: config.FromDefault}, ackWait: 30 * time.Second},
		{name: "File", file: file, concurrency: 8, origin: config.Origin{Source: config.FromFile, Line: 1}, ackWait: 5 * time.Second},
		{
			name: "EnvOverFile", file: file, env: map[string]string{"JETFLOW_CONCURRENCY": "16"},
			concurrency: 16, origin: config.Origin{Source: config.FromEnv, Name: "JETFLOW_CONCURRENCY"}, ackWait: 5 * time.Second,
		},
		{
			name: "FlagOverEnvAndFile", file: file, args: []string{"--concurrency", "32"},
			env: map[string]string{"JETFLOW_CONCURRENCY": "16"}, concurrency: 32, origin: config.Origin{Source: config.FromFlag},
			ackWait: 5 * time.Second,
		},
		{
			name: "EmptyEnvIsUnset", file: file, env: map[string]string{"JETFLOW_CONCURRENCY": ""},
			concurrency: 8, origin: config.Origin{Source: config.FromFile, Line: 1}, ackWait: 5 * time.Second,
		},
		{
			name: "EnvWithoutFile", env: map[string]string{"JETFLOW_CONCURRENCY": "2", "JETFLOW_ACK_WAIT": "1s"},
			concurrency: 2, origin: config.Origin{Source: config.FromEnv, Name: "JETFLOW_CONCURRENCY"}, ackWait: time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSettings()
			args := tc.args
			var path string
			if tc.file != "" {
				path = writeFile(t, tc.file)
				args = append([]string{"--config", path}, args...)
			}
			origins, err := config.Load(s.fs, args, env(tc.env))
			require.NoError(t, err)
			require.Equal(t, tc.concurrency, s.Concurrency)
			require.Equal(t, tc.ackWait, s.AckWait)
			want := tc.origin
			if want.Source == config.FromFile {
				want.Name = path
			}
			require.Equal(t, want, origins["concurrency"])
			require.Equal(t, config.Origin{Source: config.FromDefault}, origins["sync-always"])
		})
	}
}

func TestLoadConfigFileFromEnv(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "concurrency: 3\n")
	s := newSettings()
	origins, err := config.Load(s.fs, nil, env(map[string]string{"JETFLOW_CONFIG": path}))
	require.NoError(t, err)
	require.Equal(t, 3, s.Concurrency)
	require.Equal(t, config.Origin{Source: config.FromEnv, Name: "JETFLOW_CONFIG"}, origins[config.FileFlag])

	// --config on the command line wins over JETFLOW_CONFIG.
	other := writeFile(t, "concurrency: 4\n")
	s = newSettings()
	_, err = config.Load(s.fs, []string{"--config=" + other}, env(map[string]string{"JETFLOW_CONFIG": path}))
	require.NoError(t, err)
	require.Equal(t, 4, s.Concurrency)
}

func TestLoadFileValues(t *testing.T) {
	t.Parallel()
	s := newSettings()
	path := writeFile(t, "# comment only\nnats-url: \"nats://a:1,nats://b:2\"\nsync-always: true\nnats-password:\n")
	origins, err := config.Load(s.fs, []string{"--config", path}, nil)
	require.NoError(t, err)
	require.Equal(t, "nats://a:1,nats://b:2", s.URL)
	require.True(t, s.Sync)
	require.Empty(t, s.Password, "an empty value is the empty string")
	require.Equal(t, config.Origin{Source: config.FromFile, Name: path, Line: 3}, origins["sync-always"])

	for _, content := range []string{"", "# nothing\n", "---\n"} {
		s := newSettings()
		_, err := config.Load(s.fs, []string{"--config", writeFile(t, content)}, nil)
		require.NoError(t, err, "empty file %q", content)
		require.Equal(t, 64, s.Concurrency)
	}
}

func TestLoadLeavesArguments(t *testing.T) {
	t.Parallel()
	s := newSettings()
	_, err := config.Load(s.fs, []string{"--concurrency", "2", "start", "order"}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"start", "order"}, s.fs.Args())
}

func TestLoadCommandLineOnly(t *testing.T) {
	t.Parallel()
	s := newSettings()
	_, err := config.Load(s.fs, nil, env(map[string]string{"JETFLOW_PRINT_CONFIG": "true"}))
	require.NoError(t, err)
	require.False(t, s.PrintConfig, "a command-line-only flag ignores the environment")

	s = newSettings()
	_, err = config.Load(s.fs, []string{"--print-config"}, nil)
	require.NoError(t, err)
	require.True(t, s.PrintConfig)
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		file     string
		sentinel error
		want     []string // substrings of the message; {file} is the file's path
	}{
		{
			name: "BadEnv", env: map[string]string{"JETFLOW_CONCURRENCY": "many"},
			want: []string{`invalid value "many" for --concurrency (from JETFLOW_CONCURRENCY): `},
		},
		{
			name: "BadFileValue", file: "ack-wait: 30s\nconcurrency: lots\n",
			want: []string{`invalid value "lots" for --concurrency (from {file} line 2): `},
		},
		{name: "UnknownKey", file: "concurency: 8\n", sentinel: config.ErrUnknownKey, want: []string{`config file {file} line 1: key "concurency": unknown setting`}},
		{name: "NotScalarList", file: "concurrency: [1, 2]\n", sentinel: config.ErrNotScalar, want: []string{`{file} line 1: key "concurrency"`}},
		{name: "NotScalarMap", file: "ack-wait:\n  seconds: 3\n", sentinel: config.ErrNotScalar, want: []string{`{file} line 1: key "ack-wait"`}},
		{name: "Alias", file: "ack-wait: &w 3s\nconcurrency: *w\n", sentinel: config.ErrNotScalar, want: []string{`line 2: key "concurrency"`}},
		{name: "Duplicate", file: "concurrency: 1\n\nconcurrency: 2\n", sentinel: config.ErrDuplicateKey, want: []string{`line 3: key "concurrency"`, "first on line 1"}},
		{name: "ConfigKey", file: "config: other.yaml\n", sentinel: config.ErrNotAllowed, want: []string{`key "config"`}},
		{name: "CommandLineOnlyKey", file: "print-config: true\n", sentinel: config.ErrNotAllowed, want: []string{`key "print-config"`}},
		{name: "NotAMap", file: "- concurrency\n", sentinel: config.ErrMalformed, want: []string{"config file {file} line 1: malformed"}},
		{name: "NotYAML", file: "concurrency: 1\n  ack-wait: [\n", sentinel: config.ErrMalformed, want: []string{"config file {file}"}},
		{name: "TwoDocuments", file: "concurrency: 1\n---\nconcurrency: 2\n", sentinel: config.ErrMalformed, want: []string{"one YAML document"}},
		{name: "MissingFile", args: []string{"--config", "/nonexistent/jetflow.yaml"}, sentinel: os.ErrNotExist, want: []string{"config file /nonexistent/jetflow.yaml"}},
		{name: "MissingFileFromEnv", env: map[string]string{"JETFLOW_CONFIG": "/nonexistent/env.yaml"}, sentinel: os.ErrNotExist, want: []string{"/nonexistent/env.yaml"}},
		{name: "BadFlag", args: []string{"--ack-wait", "soon"}, want: []string{`invalid value "soon" for flag -ack-wait`}},
		{name: "Help", args: []string{"-h"}, sentinel: flag.ErrHelp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSettings()
			args := tc.args
			var path string
			if tc.file != "" {
				path = writeFile(t, tc.file)
				args = append([]string{"--config", path}, args...)
			}
			_, err := config.Load(s.fs, args, env(tc.env))
			require.Error(t, err)
			if tc.sentinel != nil {
				require.ErrorIs(t, err, tc.sentinel)
			}
			for _, w := range tc.want {
				require.ErrorContains(t, err, strings.ReplaceAll(w, "{file}", path))
			}
		})
	}
}

func TestLoadSecretErrorsDoNotQuoteTheValue(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.Int("pin", 0, "a numeric secret")
	config.Secret(fs, "pin")
	_, err := config.Load(fs, nil, env(map[string]string{"JETFLOW_PIN": "hunter2"}))
	var se *config.SettingError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "pin", se.Flag)
	require.Empty(t, se.Value)
	require.Equal(t, "invalid value for --pin (from JETFLOW_PIN)", err.Error())
	require.NotContains(t, err.Error(), "hunter2")
}

func TestLoadRejectsRedactedPlaceholder(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "nats-password: "+config.Redacted+"\n")
	s := newSettings()
	_, err := config.Load(s.fs, []string{"--config", path}, nil)
	require.ErrorIs(t, err, config.ErrRedacted)
	require.ErrorContains(t, err, "--nats-password (from "+path+" line 1)")

	// The secret from the environment wins over the placeholder.
	s = newSettings()
	_, err = config.Load(s.fs, []string{"--config", path}, env(map[string]string{"JETFLOW_NATS_PASSWORD": "s3cret"}))
	require.NoError(t, err)
	require.Equal(t, "s3cret", s.Password)
}

func TestOriginsFlag(t *testing.T) {
	t.Parallel()
	o := config.Origins{
		"a": {Source: config.FromFlag},
		"b": {Source: config.FromEnv, Name: "JETFLOW_B"},
		"c": {Source: config.FromFile, Name: "w.yaml", Line: 4},
	}
	require.Equal(t, "--a", o.Flag("a"))
	require.Equal(t, "--b (from JETFLOW_B)", o.Flag("b"))
	require.Equal(t, "--c (from w.yaml line 4)", o.Flag("c"))
	require.Equal(t, "--d", o.Flag("d"))
}

func TestPrint(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "ack-wait: 1m0s\n")
	s := newSettings()
	origins, err := config.Load(s.fs, []string{"--config", path, "--concurrency", "7", "--print-config"},
		env(map[string]string{"JETFLOW_NATS_PASSWORD": "s3cret"}))
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, config.Print(&out, s.fs, origins))
	require.Equal(t, "ack-wait: 1m0s # file "+path+"\n"+
		"concurrency: 7 # flag\n"+
		"nats-password: <redacted> # env JETFLOW_NATS_PASSWORD\n"+
		"nats-url: nats://127.0.0.1:4222 # default\n"+
		"sync-always: false # default\n", out.String())
	require.NotContains(t, out.String(), "s3cret")

	// An unset secret prints empty.
	s = newSettings()
	origins, err = config.Load(s.fs, nil, nil)
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, config.Print(&out, s.fs, origins))
	require.Contains(t, out.String(), "nats-password: \"\" # default\n")
}

// TestPrintRoundTrip feeds Print's output back as a config file: every
// value, however it has to be quoted, comes back as it was.
func TestPrintRoundTrip(t *testing.T) {
	t.Parallel()
	values := []string{
		"", "plain", "nats://u@h:4222,nats://h2:4222", "a: b", "x #y", "#lead", " padded ", "true", "null", "~",
		"123", "[list]", "{map}", "*alias", "&anchor", "!tag", "'single'", `"double"`, "line\nbreak", "tab\there",
		"- dash", "? q", "%pct", "@at", "`tick`", "é ünïcode", `back\slash`, "trailing:",
	}
	for _, v := range values {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.String("value", v, "")
		fs.Int("n", 5, "")
		origins, err := config.Load(fs, nil, nil)
		require.NoError(t, err)
		var out bytes.Buffer
		require.NoError(t, config.Print(&out, fs, origins))

		back := flag.NewFlagSet("back", flag.ContinueOnError)
		got := back.String("value", "default", "")
		n := back.Int("n", 0, "")
		path := writeFile(t, out.String())
		origins, err = config.Load(back, []string{"--config", path}, nil)
		require.NoError(t, err, "printed:\n%s", out.String())
		require.Equal(t, v, *got, "printed:\n%s", out.String())
		require.Equal(t, 5, *n)
		require.Equal(t, config.FromFile, origins["value"].Source)
	}
}

func TestMarksKeepFlagsUsable(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	on := fs.Bool("on", false, "a boolean")
	fs.String("token", "", "a `token`")
	fs.String("key", "built-in-k3y", "a key with a default")
	fs.Int("level", 3, "a number")
	config.Secret(fs, "on", "token", "key")
	config.Secret(fs, "token") // again: no change
	config.CommandLineOnly(fs, "level")
	_, err := config.Load(fs, []string{"--on", "--token", "t"}, nil)
	require.NoError(t, err)
	require.True(t, *on, "a marked boolean still takes no value")
	require.Equal(t, true, fs.Lookup("on").Value.(flag.Getter).Get())
	fs.PrintDefaults()
	require.NotContains(t, usage.String(), "panic")
	require.Contains(t, usage.String(), "-token token")
	require.NotContains(t, usage.String(), "(default false)", "a false boolean shows no default, marked or not")
	require.NotContains(t, usage.String(), "built-in-k3y", "a secret default stays out of the usage text")
	require.Contains(t, usage.String(), "(default <redacted>)")
	require.Contains(t, usage.String(), "(default 3)")

	require.Panics(t, func() { config.Secret(fs, "missing") })
}

func TestErrorsMatch(t *testing.T) {
	t.Parallel()
	s := newSettings()
	_, err := config.Load(s.fs, nil, env(map[string]string{"JETFLOW_ACK_WAIT": "x"}))
	var se *config.SettingError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "ack-wait", se.Flag)
	require.Equal(t, "x", se.Value)
	require.NotNil(t, errors.Unwrap(err))

	path := writeFile(t, "nope: 1\n")
	_, err = config.Load(newSettings().fs, []string{"--config", path}, nil)
	var fe *config.FileError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, config.FileError{Path: path, Line: 1, Key: "nope", Err: config.ErrUnknownKey}, *fe)
}

func TestFileErrorKinds(t *testing.T) {
	t.Parallel()
	err := &config.FileError{Path: "hooks.yaml", Line: 3, Key: "stripe", Err: config.ErrMalformed, Kind: "webhooks file", KeyKind: "source"}
	require.EqualError(t, err, `webhooks file hooks.yaml line 3: source "stripe": malformed config file`)
	require.ErrorIs(t, err, config.ErrMalformed)
	require.EqualError(t, &config.FileError{Path: "w.yaml", Key: "k", Err: config.ErrUnknownKey}, `config file w.yaml: key "k": unknown setting`)
}

// TestPrintFlags: every flag with a double dash and its value's name, its
// description, a non-zero default, and a secret's default redacted.
func TestPrintFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("ack-wait", 30*time.Second, "how long before a redelivery")
	fs.String("ops-addr", "127.0.0.1:8081", "`address` serving /metrics")
	fs.Bool("sync-always", false, "fsync every write")
	fs.String("nats-password", "hunter2", "password")
	config.Secret(fs, "nats-password")
	var b bytes.Buffer
	config.PrintFlags(&b, fs)
	require.Equal(t, "  --ack-wait duration\n        how long before a redelivery (default 30s)\n"+
		"  --nats-password string\n        password (default <redacted>)\n"+
		"  --ops-addr address\n        address serving /metrics (default 127.0.0.1:8081)\n"+
		"  --sync-always\n        fsync every write\n", b.String())
}
