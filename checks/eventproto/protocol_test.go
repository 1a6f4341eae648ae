package eventproto_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// approval is the payload type the test workflows declare.
type approval struct {
	By string `json:"by"`
}

// rawEnv is a real embedded server with a worker serving "approve" (waits
// on the hook <input>-approval) and "signal" (waits for the event "go"
// twice and returns both senders), and a plain NATS connection that speaks
// the protocol by hand.
type rawEnv struct {
	t  *testing.T
	nc *nats.Conn
	// timeout bounds each request: the worker's answer needs no more than
	// the Go client's default RequestTimeout (10s).
	timeout time.Duration
}

func newRawEnv(t *testing.T) *rawEnv {
	t.Helper()
	ns := testenv.Server(t)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(
		jetflow.NewWorkflow("approve", func(ctx *jetflow.Context, order string) (string, error) {
			a, err := jetflow.WaitEvent[approval](ctx, "approval", jetflow.WithHookToken(order+"-approval"))
			return a.By, err
		}, jetflow.WithEvent[approval]("approval")),
		jetflow.NewWorkflow("signal", func(ctx *jetflow.Context, _ int) (string, error) {
			a, err := jetflow.WaitEvent[approval](ctx, "go")
			if err != nil {
				return "", err
			}
			b, err := jetflow.WaitEvent[approval](ctx, "go")
			return a.By + "+" + b.By, err
		}, jetflow.WithEvent[approval]("go")),
	))
	w, err := jetflow.NewWorker(testenv.Conn(t, ns), ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctxT(t, 30*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return &rawEnv{t: t, nc: testenv.Conn(t, ns), timeout: 10 * time.Second}
}

// request sends body to jetflow.events with the plain connection, checks
// the reply against the reply schema, and decodes it.
func (e *rawEnv) request(body string) eventproto.Reply {
	e.t.Helper()
	m, err := e.nc.Request(eventproto.SendSubject, []byte(body), e.timeout)
	require.NoError(e.t, err, body)
	requireReply(e.t, m.Data)
	var r eventproto.Reply
	require.NoError(e.t, json.Unmarshal(m.Data, &r))
	return r
}

// start starts a run of workflow by a plain request to jetflow.admit.
func (e *rawEnv) start(workflow, runID, input string) {
	e.t.Helper()
	m, err := e.nc.Request("jetflow.admit."+workflow, []byte(`{"run_id":"`+runID+`","input":`+input+`}`), e.timeout)
	require.NoError(e.t, err)
	require.Contains(e.t, string(m.Data), `"outcome":"created"`)
}

// waitEnded waits for the run's final record, by a watch of its key.
func (e *rawEnv) waitEnded(runID string) map[string]any {
	e.t.Helper()
	sub, err := e.nc.SubscribeSync("$KV.jetflow_runs." + runID)
	require.NoError(e.t, err)
	defer func() { require.NoError(e.t, sub.Unsubscribe()) }()
	// The record may have been final before the subscription: read it.
	for {
		m, err := e.nc.Request("$JS.API.DIRECT.GET.KV_jetflow_runs.$KV.jetflow_runs."+runID, nil, e.timeout)
		require.NoError(e.t, err)
		var rec map[string]any
		if json.Unmarshal(m.Data, &rec) == nil && rec["status"] != "running" && rec["status"] != nil {
			return rec
		}
		_, err = sub.NextMsg(e.timeout)
		require.NoError(e.t, err, "run %s did not change", runID)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The event protocol with a plain NATS connection and hand-written JSON:
// an event by run ID and name is delivered; ten concurrent requests with
// one event ID are one delivery and nine duplicates; the same ID with
// another payload is a conflict, and another ID goes to the next wait; a
// hook resumes once its run waits, and before that, or for a token nobody
// waits on, is hook_not_found; malformed envelopes, unknown fields,
// undeclared events, bad payloads and unknown runs get their codes. Every
// reply conforms to docs/schema/event-reply.schema.json.
func TestEventProtocolRawNATS(t *testing.T) {
	t.Parallel()
	e := newRawEnv(t)

	// By run ID and name, ten at once with one event ID.
	e.start("signal", "sig-1", "0")
	const copies = 10
	replies := make(chan eventproto.Reply, copies)
	for range copies {
		go func() {
			replies <- e.request(`{"run_id":"sig-1","name":"go","event_id":"evt-1","payload":{"by":"ada"}}`)
		}()
	}
	outcomes := map[string]int{}
	var stepID string
	for range copies {
		r := <-replies
		require.Nil(t, r.Error, "%+v", r.Error)
		require.Equal(t, "sig-1", r.RunID)
		require.Equal(t, "signal", r.Workflow)
		require.Equal(t, "evt-1", r.EventID)
		require.True(t, stepID == "" || stepID == r.StepID, "one wait step holds the event")
		stepID = r.StepID
		outcomes[r.Outcome]++
	}
	require.Equal(t, map[string]int{eventproto.OutcomeDelivered: 1, eventproto.OutcomeDuplicate: copies - 1}, outcomes)
	require.Equal(t, "sig-1.event=go.0", stepID)

	// The same event ID with another payload: a conflict, while the run
	// waits for its second "go"; nothing changes.
	r := e.request(`{"run_id":"sig-1","name":"go","event_id":"evt-1","payload":{"by":"eve"}}`)
	require.NotNil(t, r.Error)
	require.Equal(t, eventproto.CodeConflict, r.Error.Code, r.Error.Message)
	// Another event ID goes to the next wait.
	r = e.request(`{"run_id":"sig-1","name":"go","event_id":"evt-2","payload":{"by":"bob"}}`)
	require.Nil(t, r.Error, "%+v", r.Error)
	require.Equal(t, eventproto.OutcomeDelivered, r.Outcome)
	require.Equal(t, "sig-1.event=go.1", r.StepID)
	rec := e.waitEnded("sig-1")
	require.Equal(t, "completed", rec["status"])
	require.Equal(t, "ada+bob", rec["output"])

	// A hook: not found until the run waits on it, then delivered once.
	r = e.request(`{"token":"o-1-approval","event_id":"h-1","payload":{"by":"ada"}}`)
	require.Equal(t, eventproto.CodeHookNotFound, r.Error.Code)
	e.start("approve", "appr-1", `"o-1"`)
	deadline := time.Now().Add(e.timeout)
	for r.Error != nil && r.Error.Code == eventproto.CodeHookNotFound {
		require.True(t, time.Now().Before(deadline), "the run never waited on its hook")
		r = e.request(`{"token":"o-1-approval","event_id":"h-1","payload":{"by":"ada"}}`)
	}
	require.Nil(t, r.Error, "%+v", r.Error)
	require.Equal(t, eventproto.OutcomeDelivered, r.Outcome)
	require.Equal(t, "appr-1", r.RunID)
	require.Equal(t, "appr-1.hook=approval.0", r.StepID)
	require.Equal(t, "ada", e.waitEnded("appr-1")["output"])

	// Refusals, each with its code.
	for body, code := range map[string]string{
		`{"token":"nobody-approval","event_id":"h-2","payload":1}`: eventproto.CodeHookNotFound,
		`not json`:         eventproto.CodeMalformed,
		`{"event_id":"e"}`: eventproto.CodeMalformed,
		`{"run_id":"sig-9","name":"go","event_id":"e","runId":"x"}`:                     eventproto.CodeMalformed,
		`{"token":"t","name":"go","event_id":"e"}`:                                      eventproto.CodeMalformed,
		`{"run_id":"sig 9","name":"go","event_id":"e"}`:                                 eventproto.CodeInvalidRunID,
		`{"run_id":"sig-9","name":"go.x","event_id":"e"}`:                               eventproto.CodeInvalidName,
		`{"token":"a.b","event_id":"e"}`:                                                eventproto.CodeInvalidToken,
		`{"token":"t","event_id":""}`:                                                   eventproto.CodeInvalidEventID,
		`{"run_id":"sig-9","name":"go","event_id":"e"}`:                                 eventproto.CodeRunNotFound,
		`{"token":"t","event_id":"e","payload":"` + strings.Repeat("x", 600_000) + `"}`: eventproto.CodeTooLarge,
	} {
		r := e.request(body)
		require.NotNil(t, r.Error, "%.80s", body)
		require.Equal(t, code, r.Error.Code, "%.80s: %s", body, r.Error.Message)
		require.Empty(t, r.Outcome)
	}

	// Undeclared event and undecodable payload, for a run that waits.
	e.start("signal", "sig-3", "0")
	r = e.request(`{"run_id":"sig-3","name":"other","event_id":"e","payload":{}}`)
	require.Equal(t, eventproto.CodeUnknownEvent, r.Error.Code)
	r = e.request(`{"run_id":"sig-3","name":"go","event_id":"e","payload":{"by":7}}`)
	require.Equal(t, eventproto.CodeInvalidPayload, r.Error.Code)
	r = e.request(`{"run_id":"sig-3","name":"go","event_id":"e","payload":{"by":"cy"}}`)
	require.Nil(t, r.Error, "the refusals stored nothing: the event ID is still free")
	require.Equal(t, eventproto.OutcomeDelivered, r.Outcome)
	require.Equal(t, "sig-3.event=go.0", r.StepID)
}
