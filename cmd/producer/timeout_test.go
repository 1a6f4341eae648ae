package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// verifyEmail waits 50ms for the event "email-verified" and, when none
// came, sends a reminder: a wait's timeout is one of its outcomes.
func verifyEmail() *jetflow.Workflow[greeting, string] {
	return jetflow.NewWorkflow("verify-email", func(ctx *jetflow.Context, in greeting) (string, error) {
		_, err := jetflow.WaitEvent[struct{}](ctx, "email-verified", jetflow.WithTimeout(50*time.Millisecond))
		if err == nil {
			return "verified", nil
		}
		if in.Name == "strict" {
			return "", err // the run fails with the timeout
		}
		return jetflow.Step(ctx, "send-reminder", func(context.Context) (string, error) { return "reminded", nil })
	}, jetflow.WithEvent[struct{}]("email-verified"))
}

// get shows a wait whose timeout passed as "timed out" with its reason,
// never as a fatal error: on the wait's line, and in the run's error when
// the workflow returned the timeout. The JSON has the wait's code.
func TestGetShowsWaitTimeout(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(verifyEmail()))
	w, err := jetflow.NewWorker(testenv.Conn(t, srv), ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	producer := (&testbed{url: srv.ClientURL()}).cli(t, nil)

	code, _, errOut := producer("start", "verify-email", `{"name":"ada"}`, "--id", "ve-1")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("wait", "ve-1")
	require.Equal(t, 0, code, errOut)
	code, out, errOut := producer("get", "ve-1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^  \S+\s+\S+\s+event=email-verified\s+ve-1\.event=email-verified\.0\s+1\s+-\s+-\s+timed out: no event email-verified within 50ms$`, out)
	require.Contains(t, out, "send-reminder")
	require.NotContains(t, out, "fatal")

	code, out, errOut = producer("get", "ve-1", "--output", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"code": "event_timeout"`)

	code, _, errOut = producer("start", "verify-email", `{"name":"strict"}`, "--id", "ve-2")
	require.Equal(t, 0, code, errOut)
	code, _, errOut = producer("wait", "ve-2")
	require.Equal(t, exitRunFailed, code, errOut)
	require.Contains(t, errOut, "timed out: no event email-verified within 50ms")
	require.NotContains(t, errOut, "fatal")
	code, out, errOut = producer("get", "ve-2")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^error: .*step event=email-verified \(ve-2\.event=email-verified\.0\) timed out: no event email-verified within 50ms$`, out)
	require.NotContains(t, out, "fatal")
}
