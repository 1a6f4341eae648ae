package workermain

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// runCommand runs the worker command over ws with args until the returned
// stop is called; the JSON log goes to the returned buffer. It fails the
// test if the command returns before it is ready. stop returns the exit
// code.
func runCommand(t *testing.T, ws *jetflow.Registry, args []string) (Endpoints, *testenv.LogBuffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	logs := &testenv.LogBuffer{}
	ready := make(chan Endpoints, 1)
	done := make(chan struct{}) // closed once code is set
	code := -1
	go func() {
		defer close(done)
		code = Run(ctx, ws, args, WithEnv(env(nil)), WithOutput(io.Discard, logs), WithReady(func(e Endpoints) { ready <- e }))
	}()
	stop := func() int {
		cancel() // as SIGTERM does
		<-done
		return code
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case ep := <-ready:
		return ep, logs, stop
	case <-done:
		t.Fatalf("the worker exited with %d before ready; its log:\n%s", code, logs)
		return Endpoints{}, nil, nil
	}
}

// jsonLines decodes every line of a JSON log, failing the test on a line
// that is not one JSON object.
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "not a JSON line: %s", sc.Text())
		lines = append(lines, line)
	}
	require.NoError(t, sc.Err())
	return lines
}

// durationKey names the fields that hold a duration.
var durationKey = regexp.MustCompile(`(^|_)(in|timeout|wait|took|delay|duration|interval|after|ttl|window|grace|age)$`)

// findLine returns the first line with message msg whose fields include
// every one of want.
func findLine(t *testing.T, lines []map[string]any, msg string, want map[string]any) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["message"] != msg {
			continue
		}
		match := true
		for k, v := range want {
			if l[k] != v {
				match = false
			}
		}
		if match {
			return l
		}
	}
	t.Fatalf("no line %q with %v", msg, want)
	return nil
}

// TestJSONLogOfFailingRuns reads the JSON log of the worker command end to
// end: a run whose step fails on every attempt and a start whose input
// fails validation. Every line about a run names its workflow and run ID, every
// duration carries its unit, and each failure is there with its cause.
func TestJSONLogOfFailingRuns(t *testing.T) {
	t.Parallel()
	type payment struct {
		Amount int `json:"amount"`
	}
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("pay", func(ctx *jetflow.Context, in payment) (string, error) {
		return jetflow.Step(ctx, "charge", func(context.Context) (string, error) {
			return "", errors.New("card service down")
		}, jetflow.WithRetry(jetflow.RetryPolicy{MaxAttempts: 2, InitialInterval: 100 * time.Millisecond}))
	})))
	ep, logs, stop := runCommand(t, ws, []string{"--data-dir", t.TempDir(), "--port", "-1", "--ops-addr", ""})

	nc, err := jetflow.Connect(ep.NatsURL, nats.Name(t.Name()))
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testWait)
	defer cancel()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	_, err = c.StartByName(ctx, "pay", json.RawMessage(`{"amount":"five"}`), jetflow.WithRunID("pay-bad-input"))
	require.ErrorIs(t, err, jetflow.ErrInvalidInput)
	_, err = c.StartByName(ctx, "pay", json.RawMessage(`{"amount":5}`), jetflow.WithRunID("pay-down"))
	require.NoError(t, err)
	run, err := c.WaitRun(ctx, "pay-down")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusFailed, run.Status)
	require.Equal(t, ExitOK, stop())

	for _, raw := range strings.Split(logs.String(), "\n") {
		require.LessOrEqual(t, strings.Count(raw, `"step_id":`), 1, "a line names step_id twice: %s", raw)
	}
	lines := jsonLines(t, logs.String())
	for _, l := range lines {
		if _, ok := l["run_id"]; ok {
			require.NotEmpty(t, l["run_id"], "a line with an empty run_id: %v", l)
			require.NotEmpty(t, l["workflow"], "a line about a run without its workflow: %v", l)
		}
		for k, v := range l {
			if !durationKey.MatchString(k) {
				continue
			}
			s, ok := v.(string)
			require.True(t, ok, "duration %s=%v without its unit: %v", k, v, l)
			_, err := time.ParseDuration(s)
			require.NoError(t, err, "duration %s=%q: %v", k, s, l)
		}
	}
	retry := findLine(t, lines, "step failed; retrying", map[string]any{"workflow": "pay", "run_id": "pay-down", "step_id": "pay-down.charge.0"})
	require.Equal(t, "info", retry["level"])
	require.Equal(t, "card service down", retry["error"])
	require.Contains(t, retry, "retry_in")
	failed := findLine(t, lines, "run failed", map[string]any{"workflow": "pay", "run_id": "pay-down", "error_kind": "step"})
	require.Equal(t, "warn", failed["level"])
	require.Contains(t, failed["error"], "card service down")
	bad := findLine(t, lines, "start refused", map[string]any{"workflow": "pay", "run_id": "pay-bad-input", "code": "invalid_input"})
	require.Equal(t, "info", bad["level"])
	require.Contains(t, bad["reason"], "undecodable input")
	findLine(t, lines, "stopping: finishing running steps", map[string]any{"drain_timeout": "30s"})
}

// TestDuplicateWindowSetting: --duplicate-window sets the engine's streams'
// window, and a worker started with another window than the streams have
// (an operator's change, or this setting changed) logs at warn what it
// changed, from what to what.
func TestDuplicateWindowSetting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := func(window string) []string {
		return []string{"--data-dir", dir, "--port", "-1", "--ops-addr", "", "--duplicate-window", window}
	}
	ep, logs, stop := runCommand(t, testWorkers(t), args("30s"))
	window := func(url string) time.Duration {
		nc, err := jetflow.Connect(url, nats.Name(t.Name()))
		require.NoError(t, err)
		defer nc.Close()
		js, err := nc.JetStream()
		require.NoError(t, err)
		info, err := js.StreamInfo("JETFLOW_TASKS")
		require.NoError(t, err)
		return info.Config.Duplicates
	}
	require.Equal(t, 30*time.Second, window(ep.NatsURL))
	require.Equal(t, ExitOK, stop())
	for _, l := range jsonLines(t, logs.String()) {
		require.NotContains(t, l["message"], "configuration changed", "creating is no change: %v", l)
	}

	ep, logs, stop = runCommand(t, testWorkers(t), args("45s"))
	require.Equal(t, 45*time.Second, window(ep.NatsURL))
	require.Equal(t, ExitOK, stop())
	changed := findLine(t, jsonLines(t, logs.String()), "stream configuration changed at start-up", map[string]any{"stream": "JETFLOW_TASKS"})
	require.Equal(t, "warn", changed["level"])
	require.Equal(t, []any{"Duplicates: 30s → 45s"}, changed["changes"])
}
