package main

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
)

// With NATS stopped, every command exits 5 (unavailable: retry with the
// same run ID), and once NATS is back the retried start finds its run or
// makes it.
func TestNATSDownExitsUnavailable(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("start", "greet", `{"name":"ada"}`, "--id", "down-1")
	require.Equal(t, 0, code, errOut)

	tb.srv.Shutdown()
	for _, args := range [][]string{
		{"start", "greet", `{"name":"ada"}`, "--id", "down-2"},
		{"get", "down-1"},
		{"wait", "down-1", "--timeout", "5s"},
		{"cancel", "down-1"},
		{"send", "down-1", "paid", "--event-id", "e-1"},
		{"resume", "tok-1", "--event-id", "e-1"},
		{"list"},
		{"reset", "k", "--scope", "global"},
	} {
		code, _, errOut := producer(args...)
		require.Equal(t, exitUnavailable, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "NATS unavailable", args)
	}

	require.NoError(t, tb.srv.Restart())
	require.Eventually(t, func() bool { // until the worker has reconnected
		code, _, _ := producer("start", "greet", `{"name":"ada"}`, "--id", "down-2")
		return code == 0
	}, 30*time.Second, 50*time.Millisecond)
	code, _, errOut = producer("wait", "down-2")
	require.Equal(t, 0, code, errOut)
}

// A NATS server without JetStream accepts the connection but cannot serve
// the engine: exit 5 too, not a usage error.
func TestJetStreamUnavailableExitsUnavailable(t *testing.T) {
	t.Parallel()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	require.NoError(t, err)
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))
	tb := &testbed{url: ns.ClientURL()}
	code, _, errOut := tb.cli(t, nil)("get", "x-1")
	require.Equal(t, exitUnavailable, code, errOut)
}
