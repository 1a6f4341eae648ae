package workermain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// testWait bounds every test of this file.
const testWait = 30 * time.Second

var orderInput = json.RawMessage(`{"order_id":"o-1","amount_cents":1999,"currency":"usd","email":"ada@example.com"}`)

// testWorkers is a registry with an "order" workflow of one step.
func testWorkers(t *testing.T) *jetflow.Registry {
	t.Helper()
	type order struct {
		OrderID string `json:"order_id"`
	}
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("order", func(ctx *jetflow.Context, in order) (string, error) {
		return jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			info, _ := jetflow.StepDetailsFrom(sctx)
			return in.OrderID + " " + info.StepID, nil
		})
	})))
	return ws
}

// serve runs the worker command over testWorkers as Run does after
// parsing cfg, calling ready once it serves.
func serve(ctx context.Context, t *testing.T, cfg config, log zerolog.Logger, ready func(Endpoints)) error {
	return newProgram([]Option{WithReady(ready)}).serve(ctx, testWorkers(t), cfg, log)
}

// startServe parses args and vars as the command does and runs serve until
// the returned stop is called (or the test ends). It fails the test if
// serve returns before it is ready. stop returns serve's error.
func startServe(t *testing.T, args []string, vars map[string]string) (Endpoints, func() error) {
	t.Helper()
	cfg, err := parseConfig(args, env(vars), false, io.Discard, io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	ready := make(chan Endpoints, 1)
	served := make(chan error, 1)
	go func() {
		log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
		served <- serve(ctx, t, cfg, log, func(e Endpoints) { ready <- e })
	}()
	done := make(chan struct{}) // closed once serve's result is in result
	var result error
	go func() {
		result = <-served
		close(done)
	}()
	stop := func() error {
		cancel() // as SIGTERM does
		<-done
		return result
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case ep := <-ready:
		return ep, stop
	case <-done:
		t.Fatalf("serve returned before ready: %v", result)
		return Endpoints{}, nil
	}
}

// completeOrder starts an order run through its own client on nc, twice,
// and waits for it to complete: proof that the worker behind nc works.
func completeOrder(t *testing.T, nc *nats.Conn, runID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testWait)
	defer cancel()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	for _, want := range []jetflow.Outcome{jetflow.OutcomeCreated, jetflow.OutcomeExisting} {
		res, err := c.StartByName(ctx, "order", orderInput, jetflow.WithRunID(runID))
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome)
	}
	run, err := c.WaitRun(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
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

// TestServe runs the worker as Main wires it — embedded server, operations
// server — runs an order started twice through it, and stops it as a
// signal would. (cmd/worker's TestServe adds the example payment service.)
func TestServe(t *testing.T) {
	t.Parallel()
	ep, stop := startServe(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", "127.0.0.1:0"}, nil)

	nc, err := jetflow.Connect(ep.NatsURL, nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	completeOrder(t, nc, "stripe-evt_123")

	code, _ := get(t, ep.OpsURL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, ep.OpsURL+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	code, body = get(t, ep.OpsURL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "\ngo_goroutines ")
	require.Contains(t, body, "\njetflow_steps_total{")

	require.NoError(t, stop())
}

func TestServeOpsAddrInUse(t *testing.T) {
	t.Parallel()
	ep, _ := startServe(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", "127.0.0.1:0"}, nil)
	cfg, err := parseConfig([]string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", strings.TrimPrefix(ep.OpsURL, "http://")},
		env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
	err = serve(t.Context(), t, cfg, testenv.Logger(t), func(Endpoints) { t.Error("ready with the ops address taken") })
	require.ErrorContains(t, err, "listen on")
}

// TestServeUserPassword: against a server that requires a password, the
// worker given it (from the environment, as a deployment would) runs an
// order to completion.
func TestServeUserPassword(t *testing.T) {
	t.Parallel()
	const password = "us3r-Pa55word"
	srv := testenv.UserPassServer(t, "app", password)
	_, stop := startServe(t, []string{"--nats-url", srv.URL, "--nats-user", "app", "--ops-addr="},
		map[string]string{"JETFLOW_NATS_PASSWORD": password})
	completeOrder(t, srv.Conn(t), "pw-order-1")
	require.NoError(t, stop())
}

// TestServeWrongPassword: a wrong password stops the worker at start-up
// with an authorization error that does not show the password, neither in
// the error nor anywhere in the command's output.
func TestServeWrongPassword(t *testing.T) {
	t.Parallel()
	const password, wrong = "r1ght-Pa55word", "wr0ng-Pa55word"
	srv := testenv.UserPassServer(t, "app", password)

	cfg, err := parseConfig([]string{"--nats-url", srv.URL, "--nats-user", "app", "--nats-password", wrong, "--ops-addr="},
		env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
	err = serve(t.Context(), t, cfg, testenv.Logger(t), func(Endpoints) { t.Error("ready with a wrong password") })
	require.ErrorIs(t, err, nats.ErrAuthorization)
	require.NotContains(t, err.Error(), wrong)
	require.NotContains(t, err.Error(), password)

	// Credentials in the URL are redacted too.
	u := strings.Replace(srv.URL, "nats://", "nats://app:"+wrong+"@", 1)
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer stderr.Close()
	for _, args := range [][]string{
		{"--nats-url", srv.URL, "--nats-user", "app", "--nats-password", wrong, "--ops-addr="},
		{"--nats-url", u, "--ops-addr="},
	} {
		require.Equal(t, 1, Run(t.Context(), testWorkers(t), args, WithEnv(env(nil)), WithOutput(io.Discard, stderr)))
	}
	out, err := os.ReadFile(stderr.Name())
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(string(out), "Authorization Violation"), "%s", out)
	require.NotContains(t, string(out), wrong)
	require.Contains(t, string(out), "app:xxxxx@127.0.0.1")
}

// TestServeTLS: against a TLS server, the worker trusting its CA (and, where
// the server verifies clients, presenting a client certificate) runs an
// order to completion; without the CA it cannot connect.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	for _, verify := range []bool{false, true} {
		name := "ServerOnly"
		if verify {
			name = "VerifyClients"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.TLSServer(t, verify)
			args := []string{"--nats-url", srv.URL, "--nats-tls-ca", srv.Certs.CAFile, "--ops-addr="}
			if verify {
				args = append(args, "--nats-tls-cert", srv.Certs.ClientCertFile, "--nats-tls-key", srv.Certs.ClientKeyFile)
			}
			_, stop := startServe(t, args, nil)
			completeOrder(t, srv.Conn(t), "tls-order-1")
			require.NoError(t, stop())

			// Trusting another CA, the worker refuses the server.
			args[3] = testenv.GenerateCerts(t).CAFile
			cfg, err := parseConfig(args, env(nil), false, io.Discard, io.Discard)
			require.NoError(t, err)
			err = serve(t.Context(), t, cfg, testenv.Logger(t), func(Endpoints) { t.Error("ready with an untrusted server") })
			require.ErrorContains(t, err, "certificate signed by unknown authority")
		})
	}
}

// TestServeEmbeddedPortInUse: a second worker on the first one's embedded
// server port says at once that the port is taken and which setting
// chooses another (the wait for readiness it no longer does would outlast
// testWait: the error is ErrPortInUse, not ErrServerNotReady).
func TestServeEmbeddedPortInUse(t *testing.T) {
	t.Parallel()
	ep, _ := startServe(t, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", ""}, nil)
	u, err := url.Parse(ep.NatsURL)
	require.NoError(t, err)
	cfg, err := parseConfig([]string{"--data-dir", t.TempDir(), "--port", u.Port(), "--ops-addr", ""}, env(nil), false, io.Discard, io.Discard)
	require.NoError(t, err)
	err = serve(t.Context(), t, cfg, testenv.Logger(t), func(Endpoints) { t.Error("ready with the port taken") })
	require.ErrorIs(t, err, natsserver.ErrPortInUse)
	require.False(t, errors.Is(err, natsserver.ErrNotReady))
	for _, want := range []string{"127.0.0.1:" + u.Port() + ": address already in use", "--port", "JETFLOW_PORT", "-1 picks a free one",
		"--nats-url nats://127.0.0.1:" + u.Port()} {
		require.ErrorContains(t, err, want)
	}
}

// Only a drain that ran out of time claims that steps will run again; a
// clean stop is no error, and any other error says nothing of the steps.
func TestStopError(t *testing.T) {
	t.Parallel()
	require.NoError(t, stopError(nil, 30*time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	err := stopError(fmt.Errorf("%w; 1 task(s) ignored cancellation and were abandoned", ctx.Err()), 30*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualError(t, err, "drain: context deadline exceeded; 1 task(s) ignored cancellation and were abandoned "+
		"(after --drain-timeout 30s; unfinished steps will run again, with the same step IDs)")

	err = stopError(nats.ErrConnectionClosed, 30*time.Second)
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
	require.EqualError(t, err, "stop: nats: connection closed")
	require.NotContains(t, err.Error(), "run again")
}
