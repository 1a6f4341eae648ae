package workermain

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// parked is a deployment with a run in flight: a NATS server, a worker of
// build v1 serving blocktest's signup, and run s-1 of it parked at its
// event, its first step (blocktest.First) committed. Code that renamed that
// step (blocktest.NewRenamed) would block it.
type parked struct {
	url    string
	client *jetflow.Client
}

func newParked(t *testing.T) parked {
	t.Helper()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	v1 := blocktest.New()
	w, err := jetflow.NewWorker(nc, registryOf(t, v1.Workflow()), jetflow.WorkerConfig{Build: "v1", Logger: testenv.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	v1.Park(t, c, "s-1")
	return parked{url: srv.ClientURL(), client: c}
}

func registryOf(t *testing.T, wfs ...jetflow.Registrable) *jetflow.Registry {
	t.Helper()
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(wfs...))
	return ws
}

// A worker started with --check-before-serving whose code would block a
// run in flight (a renamed step, against a run parked under v1) takes no
// work: /readyz answers 503 and says why, attempt after attempt, and each
// attempt's log line names the run and the divergence. Once the run has ended (v1's
// worker completes it), the worker serves.
func TestServeCheckBeforeServing(t *testing.T) {
	t.Parallel()
	d := newParked(t)
	opsPort := testenv.FreePorts(t, 1)[0]
	ops := "http://127.0.0.1:" + strconv.Itoa(opsPort)
	renamed := blocktest.NewRenamed()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &testenv.LogBuffer{}
	ready, exited := make(chan Endpoints, 1), make(chan int, 1)
	go func() {
		exited <- Run(ctx, registryOf(t, renamed.Workflow()),
			[]string{"--nats-url", d.url, "--ops-addr", "127.0.0.1:" + strconv.Itoa(opsPort), "--build", "v2"},
			WithEnv(env(map[string]string{"JETFLOW_CHECK_BEFORE_SERVING": "true"})), WithOutput(io.Discard, logs),
			WithReady(func(e Endpoints) { ready <- e }))
	}()

	const waiting = "waiting for the runs in flight this build would block to end (--check-before-serving)"
	retried := regexp.MustCompile(`attempt ([2-9]|\d\d+): `)
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = tryGet(t, ops+"/readyz")
		return code == http.StatusServiceUnavailable && containsAll(body, waiting, "run s-1 (signup)") && retried.MatchString(body)
	}, testWait, 10*time.Millisecond, "/readyz did not say, after a retry, what the worker waits for: %s", body)
	code, _ := get(t, ops+"/healthz")
	require.Equal(t, http.StatusOK, code, "a worker that waits is alive")
	logged := 0
	for _, line := range logs.Lines(t) {
		if line["message"] == waiting {
			logged++
			require.Equal(t, "warn", line["level"])
			require.Contains(t, line["error"], "1 of 1 would be blocked; run s-1 (signup) diverges at step 0 (renamed): "+
				"history has step send-welcome (s-1.send-welcome.0), the code starts step send-welcome-email (s-1.send-welcome-email.0)")
		}
	}
	require.GreaterOrEqual(t, logged, 2, "each attempt is logged: %s", logs)
	select {
	case <-ready:
		t.Fatal("ready while its code would block a run in flight")
	case code := <-exited:
		t.Fatalf("exited with %d while waiting; its log:\n%s", code, logs)
	default:
	}
	require.Zero(t, renamed.Effects(blocktest.StepID("s-1", blocktest.Renamed)), "nothing ran")

	// The run ends under v1's worker: nothing would be blocked now.
	_, err := d.client.SendEvent(ctx, "s-1", blocktest.Event, "s-1-confirmed", json.RawMessage(`"yes"`))
	require.NoError(t, err)
	run, err := d.client.WaitRun(ctx, "s-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	select {
	case <-ready:
	case code := <-exited:
		t.Fatalf("exited with %d; its log:\n%s", code, logs)
	case <-time.After(natsconn.RetryMax + startTimeout):
		t.Fatalf("not serving %s after the run ended; its log:\n%s", natsconn.RetryMax+startTimeout, logs)
	}
	code, body = get(t, ops+"/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Zero(t, renamed.Effects(blocktest.StepID("s-1", blocktest.Renamed)))
	cancel()
	require.Equal(t, ExitOK, <-exited)
}

// An invalid --build (or JETFLOW_BUILD) fails the start, exit 1, with
// jetflow.NewWorker's error (ErrInvalidBuild).
func TestServeInvalidBuild(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	for _, tc := range []struct {
		args []string
		vars map[string]string
	}{
		{[]string{"--build", "v 2"}, nil},
		{nil, map[string]string{"JETFLOW_BUILD": "v2/rc"}},
	} {
		logs := &testenv.LogBuffer{}
		code := Run(t.Context(), testWorkers(t), append([]string{"--nats-url", srv.ClientURL(), "--ops-addr="}, tc.args...),
			WithEnv(env(tc.vars)), WithOutput(io.Discard, logs))
		require.Equal(t, ExitError, code, "%v %v", tc.args, tc.vars)
		require.Contains(t, logs.String(), "jetflow: worker config: Build: "+jetflow.ErrInvalidBuild.Error())
		require.Contains(t, logs.String(), "not in [A-Za-z0-9._+-]")
	}
}
