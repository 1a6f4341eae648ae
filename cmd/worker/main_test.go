package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/testsupport/otlptest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/workermain"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// testWait bounds every test of this file.
const testWait = 30 * time.Second

var orderInput = json.RawMessage(`{"order_id":"o-1","amount_cents":1999,"currency":"usd","email":"ada@example.com"}`)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// endpoints are the addresses the started command serves on.
type endpoints struct {
	workermain.Endpoints
	PaymentsURL string
}

// startWorker runs the command as main does, with args and vars, until the
// returned stop is called (or the test ends). It fails the test if the
// command returns before it is ready. stop returns the exit code.
func startWorker(t *testing.T, args []string, vars map[string]string) (endpoints, func() int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	ws := jetflow.NewRegistry()
	ready := make(chan endpoints, 1)
	d := &demo{ws: ws}
	d.onReady = func(ep workermain.Endpoints) { ready <- endpoints{Endpoints: ep, PaymentsURL: d.paymentsURL} }
	done := make(chan struct{}) // closed once the exit code is in code
	code := -1
	go func() {
		defer close(done)
		code = workermain.Run(ctx, ws, args, append(d.options(),
			workermain.WithEnv(env(vars)), workermain.WithOutput(io.Discard, zerolog.NewTestWriter(t)))...)
	}()
	stop := func() int {
		cancel() // as SIGTERM does
		<-done
		return code
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case ep := <-ready:
		return ep, stop
	case <-done:
		t.Fatalf("the worker exited with %d before ready", code)
		return endpoints{}, nil
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestServe runs the worker as main wires it — embedded server, payment
// service, order workflow with a lost first charge response, operations
// server — takes a webhook delivered twice through it, and stops it as a
// signal would.
func TestServe(t *testing.T) {
	t.Parallel()
	ep, stop := startWorker(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--flaky-charge", "--ops-addr", "127.0.0.1:0"}, nil)

	nc, err := jetflow.Connect(ep.NatsURL, nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testWait)
	defer cancel()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	for _, want := range []jetflow.Outcome{jetflow.OutcomeCreated, jetflow.OutcomeExisting} {
		res, err := c.StartByName(ctx, "order", orderInput, jetflow.WithRunID("order-o-1"))
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome)
	}
	run, err := c.WaitRun(ctx, "order-o-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	_, err = c.StartByName(ctx, "order", orderInput, jetflow.WithGeneratedRunID())
	require.ErrorIs(t, err, jetflow.ErrRunIDRequired, "the order workflow refuses a generated run ID")

	code, body := get(t, ep.PaymentsURL+"/charges")
	require.Equal(t, http.StatusOK, code)
	var charges struct {
		Charges int `json:"charges"`
		Data    []struct {
			IdempotencyKey string `json:"idempotency_key"`
			Requests       int    `json:"requests"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &charges))
	require.Equal(t, 1, charges.Charges)
	require.Equal(t, "order-o-1.charge.0", charges.Data[0].IdempotencyKey)
	require.Equal(t, 2, charges.Data[0].Requests)

	code, _ = get(t, ep.OpsURL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body = get(t, ep.OpsURL+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get(t, ep.OpsURL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "\njetflow_steps_total{")

	require.Equal(t, 0, stop())
}

// TestDemoFlags: the example's flags are read like the worker's (flag,
// environment, config file), printed by --print-config with the others,
// and listed by -h.
func TestDemoFlags(t *testing.T) {
	t.Parallel()
	run := func(args []string, vars map[string]string) (*demo, int, string) {
		d := &demo{ws: jetflow.NewRegistry()}
		var out bytes.Buffer
		code := workermain.Run(t.Context(), d.ws, args, append(d.options(),
			workermain.WithEnv(env(vars)), workermain.WithOutput(&out, &out))...)
		return d, code, out.String()
	}
	d, code, printed := run([]string{"--print-config"}, nil)
	require.Equal(t, 0, code)
	require.Equal(t, "127.0.0.1:0", d.paymentsAddr)
	require.False(t, d.flakyCharge)
	require.Contains(t, printed, "payments-addr: 127.0.0.1:0 # default\n")
	require.Contains(t, printed, "flaky-charge: false # default\n")
	require.Equal(t, 29, strings.Count(printed, "\n"), "one line per setting:\n%s", printed)

	d, code, printed = run([]string{"--print-config", "--payments-addr", "127.0.0.1:8099"}, map[string]string{"JETFLOW_FLAKY_CHARGE": "1"})
	require.Equal(t, 0, code)
	require.Equal(t, "127.0.0.1:8099", d.paymentsAddr)
	require.True(t, d.flakyCharge)
	require.Contains(t, printed, "flaky-charge: true # env JETFLOW_FLAKY_CHARGE\n")

	_, code, usage := run([]string{"-h"}, nil)
	require.Equal(t, 0, code)
	for _, want := range []string{"Usage: worker [flags]", "Runs the jetflow example workflows.", "\n  --payments-addr address\n", "\n  --flaky-charge\n", "\n  --nats-url URL\n", "Exit codes:"} {
		require.Contains(t, usage, want)
	}
}

// TestPaymentsURL: with --payments-url the order workflow charges through
// that service, and none starts in the worker's process; a URL that is not
// http(s) stops the command before it serves.
func TestPaymentsURL(t *testing.T) {
	t.Parallel()
	pay, err := orders.StartPaymentService(orders.PaymentOptions{Log: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	defer pay.Close()

	ep, stop := startWorker(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr=", "--payments-url", pay.URL()}, nil)
	require.Equal(t, pay.URL(), ep.PaymentsURL)
	runOrder(t, ep.NatsURL, "order-o-1")
	require.Equal(t, 1, pay.ChargesFor("order-o-1.charge.0"))
	require.Equal(t, 0, stop())

	for _, bad := range []string{"127.0.0.1:8099", "ftp://127.0.0.1:8099", "http://"} {
		var out bytes.Buffer
		d := &demo{ws: jetflow.NewRegistry()}
		code := workermain.Run(t.Context(), d.ws, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr=", "--payments-url", bad},
			append(d.options(), workermain.WithEnv(env(nil)), workermain.WithOutput(&out, &out))...)
		require.Equal(t, workermain.ExitError, code, bad)
		require.Contains(t, out.String(), "--payments-url", bad)
	}
}

// TestTracingFromEnvironment: with OTEL_EXPORTER_OTLP_ENDPOINT set, the
// worker command exports its spans over OTLP/HTTP to that collector, as
// the service OTEL_SERVICE_NAME names, and flushes them when it stops.
func TestTracingFromEnvironment(t *testing.T) {
	t.Parallel()
	collector := otlptest.New(t)
	ep, stop := startWorker(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", ""},
		map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "orders-worker"})
	runOrder(t, ep.NatsURL, "order-traced")
	require.Zero(t, stop())
	traces := collector.Traces()
	require.NotEmpty(t, traces, "no OTLP request on /v1/traces")
	var all []byte
	for _, r := range traces {
		all = append(all, r.Body...)
	}
	require.Contains(t, string(all), "orders-worker", "the service name")
	require.Contains(t, string(all), "jetflow.run", "the run's span")
}

// runOrder starts the order workflow as runID through the worker's NATS
// URL and waits until it completed.
func runOrder(t *testing.T, natsURL, runID string) {
	t.Helper()
	nc, err := jetflow.Connect(natsURL, nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testWait)
	defer cancel()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	_, err = c.StartByName(ctx, "order", orderInput, jetflow.WithRunID(runID))
	require.NoError(t, err)
	run, err := c.WaitRun(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
}

// "worker check" runs the command's setup, which registers the order
// workflow (without it the check would have no workflow and fail), and
// checks that code against the deployment's runs in flight: none here.
func TestCheck(t *testing.T) {
	t.Parallel()
	ep, _ := startWorker(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr="}, nil)
	ws := jetflow.NewRegistry()
	var stdout bytes.Buffer
	code := workermain.Run(t.Context(), ws, []string{"check", "--nats-url", ep.NatsURL, "--build", "v1"},
		append((&demo{ws: ws}).options(), workermain.WithEnv(env(nil)), workermain.WithOutput(&stdout, zerolog.NewTestWriter(t)))...)
	require.Equal(t, workermain.ExitOK, code)
	require.Equal(t, "build v1 replays every run in flight of its workflows: 0 checked, none would be blocked\n", stdout.String())
	require.Equal(t, []string{"order"}, ws.Names())
}
