package main

import (
	"errors"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, env(nil), false, io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{
		DataDir: "./jetflow-data", Host: "127.0.0.1", Port: 4222, Concurrency: 64,
		AckWait: 30 * time.Second, DrainTimeout: 30 * time.Second, LogFormat: "json",
		LogLevel: zerolog.InfoLevel, PaymentsAddr: "127.0.0.1:0",
	}, c)
	require.True(t, c.embedded())

	c, err = parseConfig(nil, env(nil), true, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "console", c.LogFormat, "console on a terminal")
}

func TestParseConfigEnvFallback(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"JETFLOW_NATS_URL":      "nats://nats-1:4222",
		"JETFLOW_DATA_DIR":      "/var/lib/jetflow",
		"JETFLOW_PORT":          "4333",
		"JETFLOW_CONCURRENCY":   "8",
		"JETFLOW_ACK_WAIT":      "10s",
		"JETFLOW_DRAIN_TIMEOUT": "1m",
		"JETFLOW_SYNC_ALWAYS":   "true",
		"JETFLOW_LOG_FORMAT":    "console",
		"JETFLOW_LOG_LEVEL":     "debug",
		"JETFLOW_FLAKY_CHARGE":  "1",
	}
	c, err := parseConfig(nil, env(vars), false, io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{
		NatsURL: "nats://nats-1:4222", DataDir: "/var/lib/jetflow", Host: "127.0.0.1", Port: 4333,
		SyncAlways: true, Concurrency: 8, AckWait: 10 * time.Second, DrainTimeout: time.Minute,
		LogFormat: "console", LogLevel: zerolog.DebugLevel, PaymentsAddr: "127.0.0.1:0", FlakyCharge: true,
	}, c)
	require.False(t, c.embedded())

	// A flag wins over the environment.
	c, err = parseConfig([]string{"--concurrency", "3", "--nats-url=", "--sync-always=false"}, env(vars), false, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 3, c.Concurrency)
	require.True(t, c.embedded())
	require.False(t, c.SyncAlways)
	require.Equal(t, 10*time.Second, c.AckWait, "the rest still comes from the environment")
}

func TestParseConfigRejectsBadValues(t *testing.T) {
	t.Parallel()
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
		{"ZeroConcurrency", []string{"--concurrency", "0"}, nil, "--concurrency: must be at least 1"},
		{"ShortAckWait", nil, map[string]string{"JETFLOW_ACK_WAIT": "10ms"}, "--ack-wait: must be at least 100ms"},
		{"NegativeDrain", []string{"--drain-timeout", "-1s"}, nil, "--drain-timeout: must be positive"},
		{"LogFormat", []string{"--log-format", "xml"}, nil, `invalid value "xml" for --log-format`},
		{"LogLevel", nil, map[string]string{"JETFLOW_LOG_LEVEL": "loud"}, `invalid value "loud" for --log-level`},
		{"Port", []string{"--port", "70000"}, nil, "invalid value 70000 for --port"},
		{"EmptyDataDir", []string{"--data-dir", ""}, nil, "--data-dir: required"},
		{"StrayArgument", []string{"serve"}, nil, `unexpected argument "serve"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseConfig(tc.args, env(tc.env), false, io.Discard)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestParseConfigHelp(t *testing.T) {
	t.Parallel()
	_, err := parseConfig([]string{"-h"}, env(nil), false, io.Discard)
	require.True(t, errors.Is(err, flag.ErrHelp))
}

func TestParseConfigNatsURLSkipsEmbeddedChecks(t *testing.T) {
	t.Parallel()
	_, err := parseConfig([]string{"--nats-url", "nats://x:4222", "--data-dir", "", "--port", "0"}, env(nil), false, io.Discard)
	require.NoError(t, err)
}
