package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// With NATS stopped, every command exits 5 (unavailable: retry with the
// same run ID), wait and watch once their --timeout has run out, and once
// NATS is back the retried start finds its run or makes it.
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
		{"wait", "down-1", "--timeout", "1s"},
		{"watch", "down-1", "--timeout", "1s"},
		{"cancel", "down-1"},
		{"unblock", "down-1"},
		{"unblock", "down-1", "--accept-divergence"},
		{"send", "down-1", "paid", "--event-id", "e-1"},
		{"resume", "tok-1", "--event-id", "e-1"},
		{"list"},
		{"reset", "k", "--scope", "global"},
	} {
		began := time.Now()
		code, _, errOut := producer(args...)
		require.Equal(t, exitUnavailable, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "NATS unavailable", args)
		if args[0] == "wait" || args[0] == "watch" { // retried within --timeout first
			require.GreaterOrEqual(t, time.Since(began), time.Second, args)
			require.Contains(t, errOut, "retrying: ", args)
		} else {
			require.NotContains(t, errOut, "retrying", args)
		}
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

// asyncCLI runs the producer in the background, with a stderr that signals
// each write; done receives the exit code and outputs.
type asyncCLI struct {
	stderr *testenv.LogBuffer
	wrote  chan struct{}
	done   chan cliResult
}

type cliResult struct {
	code        int
	out, errOut string
}

func (tb *testbed) cliAsync(t *testing.T, args ...string) *asyncCLI {
	a := &asyncCLI{stderr: &testenv.LogBuffer{}, wrote: make(chan struct{}, 1), done: make(chan cliResult, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		var stdout bytes.Buffer
		code := run(ctx, args, tb.env(nil), &stdout, notifyingWriter{a.stderr, a.wrote})
		a.done <- cliResult{code: code, out: stdout.String(), errOut: a.stderr.String()}
	}()
	return a
}

// result waits for the command to end, at most within.
func (a *asyncCLI) result(t *testing.T, within time.Duration) cliResult {
	t.Helper()
	select {
	case r := <-a.done:
		return r
	case <-time.After(within):
		t.Fatalf("the command did not end within %s; stderr: %s", within, a.stderr)
	}
	return cliResult{}
}

// producer wait rides out a NATS restart (the worker that embeds it
// restarting) within its --timeout: a wait connected when NATS goes down,
// and one begun while it is down, which retries its connection. Both see
// the run end once NATS is back.
func TestWaitRidesOutNATSRestart(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("start", "inbox", `""`, "--id", "ride-1")
	require.Equal(t, 0, code, errOut)

	// A wait's client watches the runs bucket through a consumer of its
	// own: one more consumer is the first wait waiting.
	js, err := natsjs.New(testenv.Conn(t, tb.srv))
	require.NoError(t, err)
	consumers := func() int {
		info, err := js.Stream(t.Context(), "KV_jetflow_runs")
		require.NoError(t, err)
		return info.CachedInfo().State.Consumers
	}
	before := consumers()
	const timeout = 60 * time.Second
	connected := tb.cliAsync(t, "wait", "ride-1", "--timeout", timeout.String())
	require.Eventually(t, func() bool { return consumers() > before }, 20*time.Second, 10*time.Millisecond,
		"the first wait waits")

	tb.srv.Shutdown()
	began := time.Now()
	late := tb.cliAsync(t, "wait", "ride-1", "--timeout", timeout.String())
	// The late wait says it retries (stderr), instead of exiting 5.
	deadline := time.After(20 * time.Second)
	for !strings.Contains(late.stderr.String(), "retrying: ") {
		select {
		case <-late.wrote:
		case r := <-late.done:
			t.Fatalf("wait ended while NATS was down: exit %d: %s", r.code, r.errOut)
		case <-deadline:
			t.Fatalf("no retry note within 20s: %s", late.stderr)
		}
	}
	require.Contains(t, late.stderr.String(), "NATS unavailable")
	require.NotContains(t, late.stderr.String(), "outbound buffer")

	require.NoError(t, tb.srv.Restart())
	require.Eventually(t, func() bool { // until the worker has reconnected
		code, _, _ := producer("send", "ride-1", "paid", "--event-id", "paid-1", "--data", `{"ref":"r-1"}`)
		return code == 0
	}, 30*time.Second, 50*time.Millisecond)
	code, _, errOut = producer("send", "ride-1", "done", "--event-id", "done-1")
	require.Equal(t, 0, code, errOut)

	for name, w := range map[string]*asyncCLI{"connected": connected, "late": late} {
		r := w.result(t, timeout-time.Since(began))
		require.Equal(t, 0, r.code, "%s wait: %s", name, r.errOut)
		require.Equal(t, "run ride-1 completed: \"r-1\"\n", r.out, name)
	}
}
