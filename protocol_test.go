package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// The tests in this file speak the NATS protocol of docs/protocol.md the way
// a service in another language would: a plain *nats.Conn, hand-written
// JSON, maps to read answers. No SDK type is used on the client side.

// publishStart publishes a start envelope to jetflow.start.<workflow>
// through JetStream, with Nats-Msg-Id when msgID is not empty.
func publishStart(t *testing.T, js natsjs.JetStream, workflow, msgID, envelope string) *natsjs.PubAck {
	t.Helper()
	m := nats.NewMsg("jetflow.start." + workflow)
	m.Data = []byte(envelope)
	if msgID != "" {
		m.Header.Set("Nats-Msg-Id", msgID)
	}
	ack, err := js.PublishMsg(ctxT(t, 5*time.Second), m)
	require.NoError(t, err)
	require.Equal(t, "JETFLOW_STARTS", ack.Stream)
	return ack
}

// startsSettled waits until the workflow's durable start consumer has
// nothing pending and nothing unacknowledged.
func startsSettled(t *testing.T, js natsjs.JetStream, workflow string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := js.Consumer(context.Background(), "JETFLOW_STARTS", "jetflow_admit_"+workflow)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond, "durable starts of %s not settled", workflow)
}

// getJSON reads key from bucket and decodes it into a map.
func getJSON(t *testing.T, js natsjs.JetStream, bucket, key string) (map[string]any, bool) {
	t.Helper()
	kv, err := js.KeyValue(ctxT(t, 5*time.Second), bucket)
	require.NoError(t, err)
	e, err := kv.Get(ctxT(t, 5*time.Second), key)
	if err == natsjs.ErrKeyNotFound {
		return nil, false
	}
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(e.Value(), &m))
	return m, true
}

// waitRunStatus polls the run record until its status is want.
func waitRunStatus(t *testing.T, js natsjs.JetStream, runID, want string) map[string]any {
	t.Helper()
	var rec map[string]any
	require.Eventually(t, func() bool {
		var ok bool
		rec, ok = getJSON(t, js, "jetflow_runs", runID)
		return ok && rec["status"] == want
	}, 20*time.Second, 20*time.Millisecond, "run %s never %s: %v", runID, want, rec)
	return rec
}

// request sends a hand-written envelope to jetflow.admit.<workflow> and
// decodes the reply into a map.
func request(t *testing.T, nc *nats.Conn, workflow, envelope string) map[string]any {
	t.Helper()
	m, err := nc.Request("jetflow.admit."+workflow, []byte(envelope), 10*time.Second)
	require.NoError(t, err)
	var reply map[string]any
	require.NoError(t, json.Unmarshal(m.Data, &reply), string(m.Data))
	return reply
}

func errorCode(reply map[string]any) string {
	e, _ := reply["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// A start published durably with Nats-Msg-Id is absorbed by the broker when
// published twice, runs once, and can be read from the run bucket. Later
// durable starts of the same run ID go through admission exactly as an SDK
// duplicate: counted on the audit, with the fingerprint checked.
func TestProtocolDurableStart(t *testing.T) {
	env := newEnv(t, Topology{})
	effects := newCounter()
	env.worker(WorkerConfig{}, threeSteps("proto", effects))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	envelope := `{"run_id": "pr-1", "input": 1, "source": "node-svc"}`
	first := publishStart(t, js, "proto", "pr-1", envelope)
	require.False(t, first.Duplicate)
	second := publishStart(t, js, "proto", "pr-1", envelope)
	require.True(t, second.Duplicate, "the broker absorbs a republish within the window")

	rec := waitRunStatus(t, js, "pr-1", "completed")
	require.Equal(t, "pr-1", rec["run_id"])
	require.Equal(t, "proto", rec["workflow"])
	require.Equal(t, "node-svc", rec["source"])
	require.EqualValues(t, 1, rec["input"])
	require.EqualValues(t, 4, rec["output"])
	require.NotEmpty(t, rec["fingerprint"])
	for _, step := range []string{"a", "b", "c"} {
		require.Equal(t, 1, effects.get("pr-1."+step+".0"), "step %s", step)
	}
	startsSettled(t, js, "proto")
	_, audited := getJSON(t, js, "jetflow_audit", "pr-1")
	require.False(t, audited, "the broker's duplicate never reached admission")

	// Without Nats-Msg-Id the broker stores the envelope again; admission
	// finds the run: an ordinary duplicate, as for the SDK.
	publishStart(t, js, "proto", "", `{"run_id":"pr-1","input":1,"source":"retry-svc"}`)
	startsSettled(t, js, "proto")
	audit, ok := getJSON(t, js, "jetflow_audit", "pr-1")
	require.True(t, ok)
	require.EqualValues(t, 1, audit["duplicates"])
	firstDup := audit["first"].(map[string]any)
	require.Equal(t, "existing", firstDup["outcome"])
	require.Equal(t, "retry-svc", firstDup["source"])
	require.Equal(t, true, firstDup["fingerprint_match"])
	require.Equal(t, "completed", firstDup["status"])

	// Another input under the same run ID: a conflict, recorded and acked
	// (not retried), the run untouched.
	publishStart(t, js, "proto", "", `{"run_id":"pr-1","input":2}`)
	startsSettled(t, js, "proto")
	audit, _ = getJSON(t, js, "jetflow_audit", "pr-1")
	require.EqualValues(t, 2, audit["duplicates"])
	recent := audit["recent"].([]any)
	last := recent[len(recent)-1].(map[string]any)
	require.Equal(t, "conflict", last["outcome"])
	require.Equal(t, false, last["fingerprint_match"])
	rec, _ = getJSON(t, js, "jetflow_runs", "pr-1")
	require.EqualValues(t, 1, rec["input"])
	require.EqualValues(t, 4, rec["output"])

	// The per-start policy of the envelope applies on this path too.
	publishStart(t, js, "proto", "", `{"run_id":"pr-1","input":1,"policy":{"after_completed":"reject"}}`)
	startsSettled(t, js, "proto")
	audit, _ = getJSON(t, js, "jetflow_audit", "pr-1")
	require.EqualValues(t, 3, audit["duplicates"])
	recent = audit["recent"].([]any)
	require.Equal(t, "rejected", recent[len(recent)-1].(map[string]any)["outcome"])

	// The request-reply subject tells the caller the outcome.
	reply := request(t, nc, "proto", `{"run_id":"pr-1","input":1}`)
	require.Equal(t, "existing", reply["outcome"])
	require.Equal(t, "completed", reply["status"])
	require.EqualValues(t, 4, reply["duplicates"])
	for _, step := range []string{"a", "b", "c"} {
		require.Equal(t, 1, effects.get("pr-1."+step+".0"), "step %s ran again", step)
	}
}

// Request-reply on jetflow.admit.<workflow> with hand-written JSON: each
// outcome and error code a caller can get.
func TestProtocolRequestReply(t *testing.T) {
	env := newEnv(t, Topology{})
	env.worker(WorkerConfig{}, threeSteps("proto-rr", newCounter()))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	created := request(t, nc, "proto-rr", `{"run_id":"rr-1","input":10,"source":"python-backend"}`)
	require.Equal(t, "created", created["outcome"], created)
	require.Equal(t, "rr-1", created["run_id"])
	require.Equal(t, "proto-rr", created["workflow"])
	// The run's state as admission saw it: running, or already completed
	// when the worker that received the start task wrote the record and
	// finished the three steps before this admission read it back (a busy
	// machine).
	require.Contains(t, []any{"running", "completed"}, created["status"], created)
	require.Nil(t, created["error"])

	rec := waitRunStatus(t, js, "rr-1", "completed")
	require.EqualValues(t, 13, rec["output"])

	existing := request(t, nc, "proto-rr", `{"run_id":"rr-1","input":10}`)
	require.Equal(t, "existing", existing["outcome"], existing)
	require.Equal(t, "completed", existing["status"])
	require.EqualValues(t, 1, existing["duplicates"])

	conflict := request(t, nc, "proto-rr", `{"run_id":"rr-1","input":11}`)
	require.Equal(t, "conflict", errorCode(conflict), conflict)
	require.Equal(t, "rr-1", conflict["run_id"])
	require.Equal(t, "completed", conflict["status"])
	require.Nil(t, conflict["outcome"])
	// What differs: the input, which is not an object, so no fields.
	detail := conflict["error"].(map[string]any)["conflict"].(map[string]any)
	require.Equal(t, "input", detail["field"], conflict)
	require.NotEmpty(t, detail["stored"])
	require.NotEmpty(t, detail["requested"])
	require.Nil(t, detail["fields"])
	require.True(t, strings.HasSuffix(conflict["error"].(map[string]any)["message"].(string), ": input differs"), conflict)

	// Another input is an ordinary duplicate when the envelope says so.
	ignored := request(t, nc, "proto-rr", `{"run_id":"rr-1","input":11,"fingerprint":"ignore"}`)
	require.Equal(t, "existing", ignored["outcome"], ignored)

	// A run ID is generated when the envelope asks for one.
	generated := request(t, nc, "proto-rr", `{"generate_run_id":true,"input":1}`)
	require.Equal(t, "created", generated["outcome"], generated)
	require.NotEmpty(t, generated["run_id"])

	for _, c := range []struct{ envelope, code string }{
		{`{"run_id":"a.b","input":1}`, "invalid_run_id"},
		{`{"run_id":"` + strings.Repeat("x", 129) + `","input":1}`, "invalid_run_id"},
		{`{"run_id":"rr-2","input":`, "malformed_request"},
		{`not json`, "malformed_request"},
		{`{"runId":"rr-2","input":1}`, "malformed_request"},
		{`{"run_id":"rr-2","input":1} {}`, "malformed_request"},
		{`{"run_id":"rr-2","input":1,"fingerprint":"loose"}`, "malformed_request"},
		{`{"run_id":"rr-2","input":"not a number"}`, "invalid_input"},
		{`{"run_id":"rr-2","input":1,"policy":{"while_running":"queue"}}`, "invalid_policy"},
	} {
		reply := request(t, nc, "proto-rr", c.envelope)
		require.Equal(t, c.code, errorCode(reply), "%s: %v", c.envelope, reply)
		require.NotEmpty(t, reply["error"].(map[string]any)["message"])
	}
	_, stored := getJSON(t, js, "jetflow_runs", "rr-2")
	require.False(t, stored, "a refused start stored a run")
}

// levelLines returns the lines at level that logs holds whose message
// starts with msg.
func levelLines(t *testing.T, logs *testenv.LogBuffer, level, msg string) []map[string]any {
	var out []map[string]any
	for _, m := range logs.Lines(t) {
		if m["level"] == level && strings.HasPrefix(fmt.Sprint(m["message"]), msg) {
			out = append(out, m)
		}
	}
	return out
}

// An envelope that can never be admitted, published to the durable subject,
// is terminated with its reason logged at error level; it starts nothing,
// and the worker keeps admitting and running the next ones.
func TestProtocolMalformedDurableStartIsTerminated(t *testing.T) {
	env := newEnv(t, Topology{})
	logs := &testenv.LogBuffer{}
	env.worker(WorkerConfig{Logger: zerolog.New(logs).Level(zerolog.WarnLevel)}, threeSteps("proto-bad", newCounter()))
	nc := env.conn()
	js, err := natsjs.New(nc)
	require.NoError(t, err)

	bad := []struct{ msgID, envelope, code string }{
		{"bad-1", `{"run_id":"bad-1","input":`, "malformed_request"},
		{"bad-2", `[1,2,3]`, "malformed_request"},
		{"bad-3", `{"run_id":"bad-3","inptu":1}`, "malformed_request"},
		{"", `{"input":1}`, "invalid_run_id"}, // no run ID at all: cannot be made durable
		{"bad-4", `{"run_id":"bad-5","input":1}`, "invalid_run_id"},
		{"bad-6", `{"run_id":"bad-6","input":"six"}`, "invalid_input"},
		{"bad.7", `{"input":1}`, "invalid_run_id"},
	}
	for _, b := range bad {
		publishStart(t, js, "proto-bad", b.msgID, b.envelope)
	}
	startsSettled(t, js, "proto-bad")

	var terminated []map[string]any
	require.Eventually(t, func() bool {
		terminated = levelLines(t, logs, "error", "")
		return len(terminated) >= len(bad)
	}, 10*time.Second, 20*time.Millisecond)
	require.Len(t, terminated, len(bad))
	// Envelopes are admitted a few at a time: compare the codes as a set.
	want, got := map[string]int{}, map[string]int{}
	for i, b := range bad {
		want[b.code]++
		got[terminated[i]["code"].(string)]++
		require.NotEmpty(t, terminated[i]["reason"])
		require.Equal(t, "proto-bad", terminated[i]["workflow"])
	}
	require.Equal(t, want, got)

	// Nothing was started: no run record, no start task.
	kv, err := js.KeyValue(ctxT(t, 5*time.Second), "jetflow_runs")
	require.NoError(t, err)
	_, err = kv.Keys(ctxT(t, 5*time.Second))
	require.ErrorIs(t, err, natsjs.ErrNoKeysFound)
	tasks, err := js.Stream(ctxT(t, 5*time.Second), "JETFLOW_TASKS")
	require.NoError(t, err)
	require.Zero(t, tasks.CachedInfo().State.Msgs)
	// Terminated envelopes are gone from the work queue, not redelivered.
	starts, err := js.Stream(ctxT(t, 5*time.Second), "JETFLOW_STARTS")
	require.NoError(t, err)
	require.Zero(t, starts.CachedInfo().State.Msgs)

	// The worker keeps working.
	publishStart(t, js, "proto-bad", "good-1", `{"run_id":"good-1","input":0}`)
	rec := waitRunStatus(t, js, "good-1", "completed")
	require.EqualValues(t, 3, rec["output"])
	require.Len(t, levelLines(t, logs, "error", ""), len(bad))
}
