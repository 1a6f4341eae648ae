package workermain

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
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

// runCheck runs "<worker> check" over ws with args (after "check") and
// vars, and returns its exit code, stdout and log.
func runCheck(t *testing.T, ws *jetflow.Registry, args []string, vars map[string]string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	var stdout bytes.Buffer
	logs := &testenv.LogBuffer{}
	code := Run(ctx, ws, append([]string{"check"}, args...), WithEnv(env(vars)), WithOutput(&stdout, logs))
	return code, stdout.String(), logs.String()
}

// check replays the worker's code against the runs in flight, running no
// step and taking no work: code that replays run s-1 (parked under v1)
// exits 0; code that renamed its first step exits 3 (ExitWouldBlock) and
// names the run with its divergence, as a table or as JSON. The run is
// left as it was, and no worker but v1's is announced.
func TestCheck(t *testing.T) {
	t.Parallel()
	d := newParked(t)
	same, renamed := blocktest.New(), blocktest.NewRenamed()

	code, out, logs := runCheck(t, registryOf(t, same.Workflow()), []string{"--nats-url", d.url, "--build", "v1"}, nil)
	require.Equal(t, ExitOK, code, logs)
	require.Equal(t, "build v1 replays every run in flight of its workflows: 1 checked, none would be blocked\n", out)

	code, out, logs = runCheck(t, registryOf(t, renamed.Workflow()), nil,
		map[string]string{"JETFLOW_NATS_URL": d.url, "JETFLOW_BUILD": "v2"})
	require.Equal(t, ExitWouldBlock, code, logs)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	require.Equal(t, "build v2 would block 1 of the 1 runs in flight of its workflows:", lines[0])
	require.Regexp(t, `^RUN ID\s+WORKFLOW\s+DIVERGENCE\s+PLACE\s+HISTORY STEP\s+CODE STEP\s+DETAIL$`, lines[1])
	require.Regexp(t, `^s-1\s+signup\s+renamed\s+0\s+step send-welcome \(s-1\.send-welcome\.0\)\s+`+
		`step send-welcome-email \(s-1\.send-welcome-email\.0\)\s+\S`, lines[2])

	code, out, logs = runCheck(t, registryOf(t, renamed.Workflow()), []string{"--nats-url", d.url, "--build", "v2", "--output", "json"}, nil)
	require.Equal(t, ExitWouldBlock, code, logs)
	var report struct {
		Build string `json:"build"`
		jetflow.CodeCheck
	}
	require.NoError(t, json.Unmarshal([]byte(out), &report), out)
	require.Equal(t, "v2", report.Build)
	require.Equal(t, 1, report.Checked)
	require.Len(t, report.Blocked, 1)
	b := report.Blocked[0]
	require.Equal(t, "s-1", b.RunID)
	require.Equal(t, blocktest.Workflow, b.Workflow)
	require.Equal(t, jetflow.DivergenceKind("renamed"), b.Divergence.Kind)
	require.Equal(t, 0, b.Divergence.Position)
	require.Equal(t, &jetflow.DivergedStep{StepID: "s-1.send-welcome.0", Name: blocktest.First, Kind: "step"}, b.Divergence.History)
	require.Equal(t, &jetflow.DivergedStep{StepID: "s-1.send-welcome-email.0", Name: blocktest.Renamed, Kind: "step"}, b.Divergence.Code)

	// Nothing ran, nothing changed, nobody joined.
	require.Zero(t, same.Effects(blocktest.StepID("s-1", blocktest.First)))
	require.Zero(t, renamed.Effects(blocktest.StepID("s-1", blocktest.Renamed)))
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	desc, err := d.client.Describe(ctx, "s-1")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusRunning, desc.Status)
	require.Len(t, desc.Steps, 1)
	roster, err := d.client.Roster(ctx)
	require.NoError(t, err)
	require.Len(t, roster.Workers, 1, "only v1's worker")
	require.Equal(t, "v1", roster.Workers[0].Build)
}

// check's errors: without --nats-url, with flags before it, with a bad
// --output, and --output without check are usage errors (exit 2); NATS
// that cannot be reached and an invalid build fail it (exit 1).
func TestCheckErrors(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	ws := registryOf(t, blocktest.New().Workflow())
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check"}, ExitUsage, "worker: check needs --nats-url"},
		{[]string{"--nats-url", srv.ClientURL(), "check"}, ExitUsage, "worker: check comes first: worker check [flags]"},
		{[]string{"check", "--nats-url", srv.ClientURL(), "--output", "yaml"}, ExitUsage, `invalid value "yaml" for --output`},
		{[]string{"--nats-url", srv.ClientURL(), "--output", "json"}, ExitUsage, "--output is a flag of worker check"},
		{[]string{"check", "--nats-url", "nats://127.0.0.1:1"}, ExitError, "connect to nats://127.0.0.1:1"},
		{[]string{"check", "--nats-url", srv.ClientURL(), "--build", "v 2"}, ExitError, "worker config: Build: " + jetflow.ErrInvalidBuild.Error()},
	} {
		var stdout bytes.Buffer
		logs := &testenv.LogBuffer{}
		code := Run(t.Context(), ws, tc.args, WithEnv(env(nil)), WithOutput(&stdout, logs))
		require.Equal(t, tc.code, code, "%v: %s", tc.args, logs)
		require.Contains(t, logs.String(), tc.want, "%v", tc.args)
		require.Empty(t, stdout.String(), "%v", tc.args)
	}
}

// The text report escapes what it prints from stored records, and says
// when the code has no build identity.
func TestCheckReportText(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, checkReport{CodeCheck: jetflow.CodeCheck{Checked: 2, Blocked: []jetflow.BlockedRun{{
		RunID: "r-1", Workflow: "wf", Divergence: &jetflow.Divergence{Kind: jetflow.DivergenceKind("panicked"), Position: 3, Detail: "boom\x1b[31m"},
	}}}}.write(&b, false))
	require.Contains(t, b.String(), "the code (no build identity) would block 1 of the 2 runs in flight of its workflows:\n")
	require.Regexp(t, `\nr-1\s+wf\s+panicked\s+3\s+no step\s+no step\s+boom\\x1b\[31m\n$`, b.String())
}
