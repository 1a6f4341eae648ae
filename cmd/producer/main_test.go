package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

type greeting struct {
	Name string `json:"name"`
}

// greet is the tiny workflow the tests serve: one step, and a failure for
// a name that starts with "nobody", which the error repeats.
func greet() *jetflow.Workflow[greeting, string] {
	return jetflow.NewWorkflow("greet", func(ctx *jetflow.Context, in greeting) (string, error) {
		if strings.HasPrefix(in.Name, "nobody") {
			return "", errors.New("cannot greet " + in.Name)
		}
		return jetflow.Step(ctx, "say-hello", func(context.Context) (string, error) {
			return "hello, " + in.Name, nil
		})
	})
}

// hold is a workflow whose one step runs until release is closed, so that
// its runs stay running while a test looks at them.
func hold(release <-chan struct{}) *jetflow.Workflow[greeting, string] {
	return jetflow.NewWorkflow("hold", func(ctx *jetflow.Context, in greeting) (string, error) {
		return jetflow.Step(ctx, "wait-for-release", func(sctx context.Context) (string, error) {
			select {
			case <-release:
				return "released", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		})
	})
}

// paid is the payload of inbox's event "paid".
type paid struct {
	Ref string `json:"ref"`
}

// inbox waits for the event "paid", by run and name, or on the hook token
// its input names when not empty, then for the event "done" (so that the
// run is still running when a test repeats its "paid"), and returns the
// paid event's ref.
func inbox() *jetflow.Workflow[string, string] {
	return jetflow.NewWorkflow("inbox", func(ctx *jetflow.Context, token string) (string, error) {
		var opts []jetflow.WaitOption
		if token != "" {
			opts = append(opts, jetflow.WithHookToken(token))
		}
		p, err := jetflow.WaitEvent[paid](ctx, "paid", opts...)
		if err != nil {
			return "", err
		}
		_, err = jetflow.WaitEvent[json.RawMessage](ctx, "done")
		return p.Ref, err
	}, jetflow.WithEvent[paid]("paid"), jetflow.WithEvent[json.RawMessage]("done"))
}

// lookupKey is the task key the lookup workflow's step uses: shared by
// every run of the workflow for an hour.
func lookupKey(name string) string { return "user/" + name }

// cliFunc runs the producer against the test's server and returns the exit
// code, stdout and stderr.
type cliFunc func(args ...string) (code int, stdout, stderr string)

// testbed is one test's embedded server and a worker serving the test
// workflows: greet, hold, exclusive (hold that rejects duplicates while
// running), lookup (a step cached under lookupKey in the workflow scope),
// inbox (waits for an event), flaky (its step "charge" fails its first
// two attempts with "declined: " and the name, then returns the name) and
// blocktest's signup (the worker's build is blocktest.Build).
type testbed struct {
	url string
	// srv is the embedded server, for tests that stop and restart it.
	srv *natsserver.Server
	// lookups counts the runs of lookup's step that were not served from
	// the task key's cache.
	lookups atomic.Int64
	// signup is the code of blocktest's workflow (block blocks a run).
	signup *blocktest.Code
}

func newTestbed(t *testing.T) *testbed {
	t.Helper()
	return newTestbedOn(t, testenv.Server(t))
}

// newTestbedOn is newTestbed on srv, a server the test started.
func newTestbedOn(t *testing.T, srv *natsserver.Server) *testbed {
	t.Helper()
	tb := &testbed{signup: blocktest.New()}
	nc := testenv.Conn(t, srv)
	ws := jetflow.NewRegistry()
	release := make(chan struct{})
	exclusive := jetflow.NewWorkflow("exclusive", func(ctx *jetflow.Context, in greeting) (string, error) {
		return jetflow.Step(ctx, "wait-for-release", func(sctx context.Context) (string, error) {
			select {
			case <-release:
				return "released", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		})
	}, jetflow.WithDefaultConflictPolicy(jetflow.ConflictPolicy{WhileRunning: jetflow.RejectWhileRunning}))
	lookup := jetflow.NewWorkflow("lookup", func(ctx *jetflow.Context, in greeting) (int64, error) {
		return jetflow.Step(ctx, "fetch", func(context.Context) (int64, error) {
			return tb.lookups.Add(1), nil
		}, jetflow.WithTaskKey(lookupKey(in.Name), time.Hour), jetflow.WithKeyScope(jetflow.ScopeWorkflow))
	})
	flaky := jetflow.NewWorkflow("flaky", func(ctx *jetflow.Context, in greeting) (string, error) {
		return jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
			if d, _ := jetflow.StepDetailsFrom(sctx); d.Attempt < 3 {
				return "", errors.New("declined: " + in.Name)
			}
			return in.Name, nil
		}, jetflow.WithBackoff(10*time.Millisecond, 10*time.Millisecond))
	})
	require.NoError(t, ws.Register(greet(), hold(release), exclusive, lookup, inbox(), flaky, tb.signup.Workflow()))
	w, err := jetflow.NewWorker(nc, ws, jetflow.WorkerConfig{
		Logger: testenv.Logger(t),
		Build:  blocktest.Build,
	})
	require.NoError(t, err)
	startCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.Start(startCtx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	t.Cleanup(func() { close(release) }) // before Stop: cleanups run last-in first-out
	tb.url, tb.srv = srv.ClientURL(), srv
	return tb
}

// block blocks a run of signup under runID (blocktest.Code.Block), through
// a client of the test's own, and returns it.
func (tb *testbed) block(t *testing.T, runID string) jetflow.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := jetflow.NewClient(ctx, testenv.Conn(t, tb.srv), jetflow.ClientConfig{})
	require.NoError(t, err)
	return tb.signup.Block(t, c, runID)
}

// env is the environment the producer sees: JETFLOW_NATS_URL pointing at
// the test's server, and vars.
func (tb *testbed) env(vars map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		if k == "JETFLOW_NATS_URL" {
			return tb.url
		}
		return ""
	}
}

// cli runs the producer with the environment env(vars).
func (tb *testbed) cli(t *testing.T, vars map[string]string) cliFunc {
	return func(args ...string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, tb.env(vars), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
}

// setup starts a testbed and returns a way to run the producer against it.
func setup(t *testing.T) cliFunc {
	t.Helper()
	return newTestbed(t).cli(t, nil)
}

func TestStartGetWait(t *testing.T) {
	t.Parallel()
	producer := setup(t)

	code, out, errOut := producer("start", "greet", `{"name": "ada"}`, "--id", "evt_1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "created run evt_1\n", out)
	require.Empty(t, errOut)

	// The same ID again, with the flag first this time: the existing run.
	code, out, errOut = producer("--id", "evt_1", "start", "greet", `{"name":"ada"}`)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `^existing run evt_1 \(status (running|completed), 1 duplicates absorbed\)\n$`, out)

	code, out, errOut = producer("wait", "evt_1", "--timeout", "20s")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "run evt_1 completed: \"hello, ada\"\n", out)

	code, out, errOut = producer("get", "evt_1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status:      completed\n")
	require.Contains(t, out, "duplicates:  1\n")
	require.Contains(t, out, `input:       {"name":"ada"}`)
	require.Contains(t, out, `output:      "hello, ada"`)
	require.Regexp(t, `\+\S+\s+\S+\s+say-hello\s+evt_1\.say-hello\.0\s+1\s+\S+\s+-\n`, out)

	code, out, errOut = producer("start", "greet", `{"name":"ada"}`, "--id", "evt_1", "--output", "json")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"run_id":"evt_1","workflow":"greet","outcome":"existing","status":"completed","duplicates":2}`, out)

	code, out, errOut = producer("get", "evt_1", "--output=json")
	require.Equal(t, 0, code, errOut)
	var run struct {
		Status           string `json:"status"`
		Duplicates       int    `json:"duplicates"`
		RecentDuplicates []struct {
			Outcome          string `json:"outcome"`
			FingerprintMatch bool   `json:"fingerprint_match"`
		} `json:"recent_duplicates"`
		Output json.RawMessage `json:"output"`
		Steps  []struct {
			StepID  string `json:"step_id"`
			Attempt int    `json:"attempt"`
		} `json:"steps"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &run))
	require.Equal(t, "completed", run.Status)
	require.Equal(t, 2, run.Duplicates)
	require.Len(t, run.RecentDuplicates, 2)
	require.Equal(t, "existing", run.RecentDuplicates[1].Outcome)
	require.True(t, run.RecentDuplicates[1].FingerprintMatch)
	require.JSONEq(t, `"hello, ada"`, string(run.Output))

	code, out, errOut = producer("get", "evt_1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "duplicate starts")
	require.Len(t, run.Steps, 1)
	require.Equal(t, "evt_1.say-hello.0", run.Steps[0].StepID)
	require.Equal(t, 1, run.Steps[0].Attempt)
}

// A start needs --id or --generate-id: an empty --id (an unset variable in
// a script) and no --id at all are errors, every time, and start nothing;
// --generate-id makes a new run with a generated ID.
func TestStartRunIDFlags(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	for range 2 { // a retried script: still nothing started
		code, _, errOut := producer("start", "greet", `{"name":"bob"}`, "--id", "")
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "error: --id is empty")
		code, _, errOut = producer("start", "greet", `{"name":"bob"}`, "--id=")
		require.Equal(t, 1, code, errOut)
		code, _, errOut = producer("start", "greet", `{"name":"bob"}`)
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "error: start needs --id RUNID")
	}
	code, _, errOut := producer("start", "greet", `{"name":"bob"}`, "--id", "x-1", "--generate-id")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "exclude each other")
	code, out, errOut := producer("list", "--output", "json")
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"runs":[]}`, out, "a refused start stores nothing")

	code, out, errOut = producer("start", "greet", `{"name":"bob"}`, "--generate-id", "--output", "json")
	require.Equal(t, 0, code, errOut)
	var res struct {
		RunID   string `json:"run_id"`
		Outcome string `json:"outcome"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, "created", res.Outcome)
	require.NotEmpty(t, res.RunID)

	code, _, errOut = producer("wait", res.RunID)
	require.Equal(t, 0, code, errOut)
}

func TestWaitFailedRun(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, _, errOut := producer("start", "greet", `{"name":"nobody"}`, "--id", "evt_2")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("wait", "evt_2")
	require.Equal(t, 2, code)
	require.Equal(t, "run evt_2 failed\n", out)
	require.Equal(t, "error: jetflow: run evt_2 failed (workflow): cannot greet nobody\n", errOut)

	code, out, _ = producer("get", "evt_2")
	require.Equal(t, 0, code, "get succeeds on a failed run")
	require.Contains(t, out, "error:       workflow: cannot greet nobody")
	require.Contains(t, out, "steps: none\n")
}

func TestErrors(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"UnknownWorkflow", []string{"start", "nope", `{}`, "--id", "u-1"}, 3, `error: start nope: jetflow: unknown workflow: no worker serves "nope", and none ever has`},
		{"InvalidJSON", []string{"start", "greet", `{"name":`, "--id", "u-2"}, 1, "error: invalid JSON input: unexpected end of JSON input"},
		{"UndecodableInput", []string{"start", "greet", `"ada"`, "--id", "u-3"}, 1, "cannot unmarshal string into Go value of type main.greeting"},
		{"InvalidRunID", []string{"start", "greet", `{}`, "--id", "evt 1"}, 1, "error: start greet: jetflow: invalid run ID"},
		{"GetNotFound", []string{"get", "evt_missing"}, 3, "error: jetflow: run not found: evt_missing"},
		{"WaitNotFound", []string{"wait", "evt_missing"}, 3, "error: jetflow: run not found: evt_missing"},
		{"GetInvalidRunID", []string{"get", "a.b"}, 1, "error: jetflow: invalid run ID"},
		{"CancelNotFound", []string{"cancel", "evt_missing"}, 3, "error: jetflow: run not found: evt_missing"},
		{"CancelInvalidRunID", []string{"cancel", "a.b"}, 1, "error: jetflow: invalid run ID"},
		{"CancelNoRunID", []string{"cancel"}, 1, "error: cancel takes one run ID: producer cancel <run-id>"},
		{"CancelTwoRunIDs", []string{"cancel", "evt_1", "evt_2"}, 1, "error: cancel takes one run ID"},
		{"TimeoutOnCancel", []string{"cancel", "evt_1", "--timeout", "1s"}, 1, "error: --timeout is a flag of wait and watch, not cancel"},
		{"UnblockNotFound", []string{"unblock", "evt_missing"}, 3, "error: jetflow: run not found: evt_missing"},
		{"AcceptNotFound", []string{"unblock", "evt_missing", "--accept-divergence"}, 3, "error: jetflow: run not found: evt_missing"},
		{"UnblockInvalidRunID", []string{"unblock", "a.b"}, 1, "error: jetflow: invalid run ID"},
		{"UnblockNoRunID", []string{"unblock"}, 1, "error: unblock takes one run ID: producer unblock <run-id> [--accept-divergence]"},
		{"AcceptOnCancel", []string{"cancel", "evt_1", "--accept-divergence"}, 1, "error: --accept-divergence is a flag of unblock, not cancel"},
		{"NoCommand", nil, 1, "error: no command given"},
		{"UnknownCommand", []string{"nope"}, 1, `error: unknown command "nope": want start, get, watch, wait, cancel, unblock, send, resume, list, reset, workers, engine or serve`},
		{"StartArity", []string{"start", "greet"}, 1, "error: start takes a workflow name and a JSON input"},
		{"WaitArity", []string{"wait"}, 1, "error: wait takes one run ID"},
		{"IDOnGet", []string{"get", "evt_1", "--id", "x"}, 1, "error: --id is a flag of start and rerun, not get"},
		{"BadOutput", []string{"get", "evt_1", "--output", "yaml"}, 1, `error: invalid value "yaml" for --output`},
		{"BadFlag", []string{"get", "evt_1", "--verbose"}, 1, "error: flag provided but not defined: -verbose"},
		{"NoServer", []string{"get", "evt_1", "--nats-url", "nats://127.0.0.1:1"}, 5, "connect to nats://127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := producer(tc.args...)
			require.Equal(t, tc.code, code, errOut)
			require.Empty(t, out)
			require.Contains(t, errOut, tc.want)
			require.Equal(t, 1, bytes.Count([]byte(errOut), []byte("\n")), "one line: %q", errOut)
		})
	}
}

func TestRunningRun(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, out, errOut := producer("start", "hold", `{"name":"eve"}`, "--id", "evt_3")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "created run evt_3\n", out)
	code, out, errOut = producer("start", "hold", `{"name":"eve"}`, "--id", "evt_3")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "existing run evt_3 (status running, 1 duplicates absorbed)\n", out)

	code, out, errOut = producer("wait", "evt_3", "--timeout", "100ms")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Equal(t, "error: run evt_3 did not end within 100ms\n", errOut)

	code, out, errOut = producer("get", "evt_3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "status:      running\n")
	require.NotContains(t, out, "output:")
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stdout, &stderr)
	require.Equal(t, 0, code)
	require.Contains(t, stdout.String(), "Usage: producer")
	require.Empty(t, stderr.String())
}
