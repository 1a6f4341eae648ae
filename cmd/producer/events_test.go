package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// waitHook waits until a run has registered the hook token: its record is
// in the hooks bucket (a KV watch, not a poll).
func (tb *testbed) waitHook(t *testing.T, token string) {
	t.Helper()
	js, err := natsjs.New(testenv.Conn(t, tb.srv))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, jetstream.HooksBucket)
	require.NoError(t, err)
	w, err := kv.Watch(ctx, token)
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Stop()) }()
	for {
		select {
		case e := <-w.Updates():
			if e != nil && e.Operation() == natsjs.KeyValuePut {
				return
			}
		case <-ctx.Done():
			t.Fatalf("hook %s was not registered: %v", token, ctx.Err())
		}
	}
}

// send delivers an event, prints what it did, and a repeat says it is a
// duplicate (exit 0 both times); the same event ID with another payload is
// a conflict (exit 4), an unknown run not found (3), an undeclared event
// or a payload of the wrong type an error (1), and an event after the run
// ended an error (1) that says so.
func TestSendEvent(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, _, errOut := producer("start", "inbox", `""`, "--id", "in-1")
	require.Equal(t, 0, code, errOut)

	code, out, errOut := producer("send", "in-1", "paid", "--event-id", "e-1", "--data", `{"ref": "r1"}`)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "delivered e-1 to in-1 (step in-1.event=paid.0)\n", out)
	code, out, errOut = producer("send", "--data", `{"ref":"r1"}`, "in-1", "paid", "--event-id", "e-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "duplicate e-1: already delivered to in-1 (step in-1.event=paid.0)\n", out)

	code, _, errOut = producer("send", "in-1", "paid", "--event-id", "e-1", "--data", `{"ref":"r2"}`)
	require.Equal(t, exitConflict, code, errOut)
	require.Contains(t, errOut, "event conflicts")
	code, _, errOut = producer("send", "in-1", "refund", "--event-id", "e-2", "--data", `{}`)
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "declares no such event")
	code, _, errOut = producer("send", "in-1", "paid", "--event-id", "e-3", "--data", `{"ref":7}`)
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "invalid event payload")
	code, _, errOut = producer("send", "in-1", "paid", "--event-id", "e-3", "--data", `{"ref":`)
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "invalid JSON for --data")
	code, _, errOut = producer("send", "nobody-1", "paid", "--event-id", "e-1")
	require.Equal(t, exitNotFound, code, errOut)
	code, _, errOut = producer("send", "in-1", "done", "--event-id", "d-1")
	require.Equal(t, 0, code, errOut)

	code, out, errOut = producer("wait", "in-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "run in-1 completed: \"r1\"\n", out)

	// After the run ended: the event it took is still a duplicate, a new
	// one is refused.
	code, out, errOut = producer("send", "in-1", "paid", "--event-id", "e-1", "--data", `{"ref":"r1"}`)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "duplicate e-1")
	code, _, errOut = producer("send", "in-1", "paid", "--event-id", "e-9", "--data", `{"ref":"r9"}`)
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "cannot deliver the event: jetflow: run already ended")
	require.Contains(t, errOut, "completed")
}

// --output json prints the HTTP API's body; without --data the payload is
// null.
func TestSendEventJSON(t *testing.T) {
	t.Parallel()
	producer := setup(t)
	code, _, errOut := producer("start", "inbox", `""`, "--id", "in-2")
	require.Equal(t, 0, code, errOut)
	for _, want := range []jetflow.EventOutcome{jetflow.EventDelivered, jetflow.EventDuplicate} {
		code, out, errOut := producer("send", "in-2", "paid", "--event-id", "e-null", "--output", "json")
		require.Equal(t, 0, code, errOut)
		var d httpapi.EventDelivery
		require.NoError(t, json.Unmarshal([]byte(out), &d), out)
		require.Equal(t, httpapi.EventDelivery{Outcome: want, RunID: "in-2", Workflow: "inbox",
			StepID: "in-2.event=paid.0", EventID: "e-null"}, d)
	}
	code, _, errOut = producer("send", "in-2", "done", "--event-id", "d-1")
	require.Equal(t, 0, code, errOut)
	code, out, errOut := producer("wait", "in-2")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "run in-2 completed: \"\"\n", out, "a null payload decodes to the zero value")
}

// resume: a token no run waits on is not found (exit 3); once the run
// waits on it the event is delivered, a repeat is a duplicate and another
// event a conflict (exit 4: a hook resumes one wait once), and the run
// completes with the event.
func TestResumeHook(t *testing.T) {
	t.Parallel()
	tb := newTestbed(t)
	producer := tb.cli(t, nil)
	code, _, errOut := producer("resume", "tok-1", "--event-id", "a-1", "--data", `{"ref":"ok"}`)
	require.Equal(t, exitNotFound, code, errOut)
	require.Contains(t, errOut, "no run waits on this hook token")

	code, _, errOut = producer("start", "inbox", `"tok-1"`, "--id", "hk-1")
	require.Equal(t, 0, code, errOut)
	tb.waitHook(t, "tok-1")
	code, out, errOut := producer("resume", "tok-1", "--event-id", "a-1", "--data", `{"ref":"ok"}`)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "delivered a-1 to hk-1 (step hk-1.hook=paid.0)\n", out)
	code, out, errOut = producer("resume", "tok-1", "--event-id", "a-1", "--data", `{"ref":"ok"}`)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "duplicate a-1: already delivered to hk-1 (step hk-1.hook=paid.0)\n", out)
	code, _, errOut = producer("resume", "tok-1", "--event-id", "a-2", "--data", `{"ref":"ok"}`)
	require.Equal(t, exitConflict, code, errOut)
	code, _, errOut = producer("send", "hk-1", "done", "--event-id", "d-1")
	require.Equal(t, 0, code, errOut)
	code, out, errOut = producer("wait", "hk-1")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "run hk-1 completed: \"ok\"\n", out)
}

// send and resume need a non-empty --event-id and their arguments; their
// flags belong to them only. All are refused before connecting.
func TestEventCommandUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "r-1", "paid"}, "send needs --event-id ID"},
		{[]string{"send", "r-1", "paid", "--event-id", ""}, "send needs --event-id ID"},
		{[]string{"resume", "tok", "--data", "{}"}, "resume needs --event-id ID"},
		{[]string{"send", "r-1", "--event-id", "e"}, "send takes a run ID and an event name"},
		{[]string{"resume", "--event-id", "e"}, "resume takes one hook token"},
		{[]string{"start", "greet", "{}", "--id", "x", "--event-id", "e"}, "--event-id is a flag of send and resume, not start"},
		{[]string{"get", "r-1", "--data", "{}"}, "--data is a flag of send and resume, not get"},
	} {
		code, _, errOut := runNoServer(t, map[string]string{"JETFLOW_EVENT_ID": "from-env"}, tc.args...)
		require.Equal(t, exitError, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, tc.args)
	}
}
