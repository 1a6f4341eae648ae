package startproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/jetflowtype"
)

// startSeeds are envelopes as other-language clients send them, well-formed
// or not. The files under testdata/fuzz/<FuzzName>/ add more.
var startSeeds = []string{
	`{"run_id":"stripe-evt_123","input":{"n":1,"tags":["a"]},"source":"node"}`,
	`{"run_id":"order-42","input":{"n":2}}`,
	`{"input":{"n":3}}`,
	`{"run_id":"k-1"}`,
	`{"run_id":"b64==","input":null,"source":""}`,
	`{"run_id":"k-2","input":"five"}`,
	`{"run_id":"k-3","input":{"n":"x"}}`,
	`{"run_id":"k-4","input":{"n":1},"extra":true}`,
	`{"RUN_ID":"k-5","Input":{"n":5}}`,
	`{"run_id":"k-6","input":{"n":6},"run_id":"k-7"}`,
	`{"run_id":"a b","input":1}`,
	`{"run_id":"a.b","input":1}`,
	`{"run_id":"order>","input":1}`,
	`{"run_id":7}`,
	`{"run_id":"k-8","input":{"n":`,
	`{"run_id":"k-9","input":{"tags":["<&>\u2028"]}}`,
	`{"run_id":"","input":{}}`,
	`{"run_id":null,"input":{}}`,
	`{"generate_run_id":true,"input":{"n":1}}`,
	`{"generate_run_id":true,"run_id":"k-10"}`,
	`{"run_id":"k-11","run_id":null}`,
	`not json`, `[]`, `null`, `{}`, ``, `"x"`,
}

// FuzzDecodeStartRequest checks the start envelope decoder: it never
// panics; a rejection wraps one of the typed errors a reply is coded from;
// an accepted request has a valid run ID (the one sent, or a generated one
// when the envelope asked for it),
// a valid workflow name, valid JSON input within MaxInputBytes, and
// round-trips through the envelope encoding.
func FuzzDecodeStartRequest(f *testing.F) {
	for _, s := range startSeeds {
		f.Add("checkout", []byte(s))
	}
	f.Add("", []byte(`{"run_id":"r","input":1}`))
	f.Add("a.b", []byte(`{"run_id":"r","input":1}`))
	f.Add("x>", []byte(`{"run_id":"r","input":1}`))
	f.Fuzz(func(t *testing.T, workflow string, body []byte) {
		req, err := DecodeStartRequest(workflow, body, jetflowtype.ConflictPolicy{})
		if err != nil {
			requireTyped(t, err)
			return
		}
		checkRequest(t, workflow, req)
		var sent struct {
			RunID    *string `json:"run_id"`
			Generate bool    `json:"generate_run_id"`
		}
		require.NoError(t, json.Unmarshal(body, &sent), "accepted envelope %q", body)
		require.True(t, (sent.RunID != nil) != sent.Generate, "accepted %q: a run ID must be given or asked for", body)
		if sent.RunID != nil {
			require.Equal(t, *sent.RunID, req.RunID, "run ID changed")
		}

		// Round trip: the envelope a client would send for req decodes to
		// req again.
		b2, err := state.Encode(StartRequest{RunID: req.RunID, Input: req.Input, Source: req.Source})
		require.NoError(t, err)
		req2, err := DecodeStartRequest(workflow, b2, jetflowtype.ConflictPolicy{})
		require.NoError(t, err, "re-encoded envelope %s", b2)
		require.Equal(t, req.RunID, req2.RunID)
		require.Equal(t, req.Workflow, req2.Workflow)
		require.Equal(t, req.Source, req2.Source)
		requireSameJSON(t, req.Input, req2.Input)
	})
}

// requireTyped fails unless err wraps a sentinel that a start reply maps to
// an error code.
func requireTyped(t *testing.T, err error) {
	t.Helper()
	for _, target := range []error{state.ErrCorrupt, state.ErrInvalidRunID, state.ErrInvalidName, state.ErrInputTooLarge, jetflowtype.ErrInvalidConflictPolicy, ErrRunIDRequired} {
		if errors.Is(err, target) {
			return
		}
	}
	t.Fatalf("untyped rejection: %v", err)
}

func checkRequest(t *testing.T, workflow string, req dedupe.Request) {
	t.Helper()
	require.Equal(t, workflow, req.Workflow)
	require.NoError(t, state.ValidateName(req.Workflow))
	require.NoError(t, state.ValidateRunID(req.RunID))
	require.LessOrEqual(t, len(req.RunID), state.MaxRunIDLen)
	require.LessOrEqual(t, len(req.Workflow), state.MaxNameLen)
	require.NotEmpty(t, req.Input)
	require.LessOrEqual(t, len(req.Input), state.MaxInputBytes)
	require.True(t, json.Valid(req.Input), "invalid input %q accepted", req.Input)
}

// requireSameJSON compares two JSON values as values (numbers exactly).
func requireSameJSON(t *testing.T, a, b json.RawMessage) {
	t.Helper()
	va, vb := jsonValue(t, a), jsonValue(t, b)
	if !reflect.DeepEqual(va, vb) {
		t.Fatalf("JSON value changed:\n%s\n%s", a, b)
	}
}

func jsonValue(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v), "%q", raw)
	return v
}

// fuzzInput is the small input type of the workflow the start handler
// fuzz target serves.
type fuzzInput struct {
	N    int      `json:"n"`
	Tags []string `json:"tags"`
}

func checkFuzzInput(raw json.RawMessage) error {
	var in fuzzInput
	return json.Unmarshal(raw, &in)
}

// FuzzHandleStart drives the start request-reply handler end to end on one
// embedded server per fuzzing process (set up once, reused by every
// input). For every envelope:
//
//   - a reply with an error code stores nothing: a run ID that was new stays
//     absent from the runs bucket (and, unless the error is internal, has
//     no start task on the stream), and a run that existed is unchanged;
//   - an envelope the decoder rejects, or whose input the workflow cannot
//     decode, always gets an error code, never internal;
//   - otherwise the reply is created (the run was absent and now is stored
//     with this request's workflow and input, running) or existing (it was
//     there, and is unchanged; the duplicate is counted).
func FuzzHandleStart(f *testing.F) {
	for _, s := range startSeeds {
		f.Add([]byte(s))
	}
	const workflow = "fuzz-wf"
	srv := testenv.Server(f)
	nc := testenv.Conn(f, srv)
	setupCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	assets, err := jetstream.Provision(setupCtx, nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(f, err)
	a := dedupe.New(assets, dedupe.Config{})

	f.Fuzz(func(t *testing.T, body []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		// The run ID the handler will use, if the envelope names a valid one.
		var probe struct {
			RunID string `json:"run_id"`
		}
		runID := ""
		if json.Unmarshal(body, &probe) == nil && state.ValidateRunID(probe.RunID) == nil {
			runID = probe.RunID
		}
		var before stored
		if runID != "" {
			before = readRun(ctx, t, assets, runID)
		}
		_, decErr := DecodeStartRequest(workflow, body, jetflowtype.ConflictPolicy{})

		reply := handleStart(ctx, a, nil, workflow, Served{Check: checkFuzzInput}, body, "nats")

		if reply.Error != nil {
			require.Empty(t, reply.Outcome)
			require.NotEmpty(t, reply.Error.Code)
			require.NotEmpty(t, reply.Error.Message)
			if decErr != nil || reply.Error.Code == CodeInvalidInput {
				require.NotEqual(t, CodeInternal, reply.Error.Code, "bad input reported as internal: %s", reply.Error.Message)
			}
			for _, id := range []string{runID, reply.RunID} {
				if id == "" || state.ValidateRunID(id) != nil {
					continue
				}
				after := readRun(ctx, t, assets, id)
				if id == runID {
					require.Equal(t, before, after, "rejected start changed run %s", id)
				} else {
					require.False(t, after.found, "rejected start stored run %s", id)
				}
				if !after.found && reply.Error.Code != CodeInternal {
					// Rejected before admission: not even a start task.
					_, err := assets.Tasks.GetLastMsgForSubject(ctx, jetstream.RunSubject(workflow, id))
					require.ErrorIs(t, err, natsjs.ErrMsgNotFound, "rejected start published a task for %s", id)
				}
			}
			return
		}

		require.NoError(t, decErr, "accepted an envelope the decoder rejects")
		req, _ := DecodeStartRequest(workflow, body, jetflowtype.ConflictPolicy{})
		require.NoError(t, checkFuzzInput(req.Input), "accepted an input the workflow rejects")
		require.NoError(t, state.ValidateRunID(reply.RunID))
		require.Equal(t, workflow, reply.Workflow)
		if runID != "" {
			require.Equal(t, runID, reply.RunID)
		}
		after := readRun(ctx, t, assets, reply.RunID)
		require.True(t, after.found, "run %s not stored", reply.RunID)
		switch reply.Outcome {
		case dedupe.Created.String():
			require.False(t, before.found, "created over an existing run %s", runID)
			run, err := state.DecodeRun(after.value)
			require.NoError(t, err)
			require.Equal(t, workflow, run.Workflow)
			require.Equal(t, state.StatusRunning, run.Status)
			require.Equal(t, state.StatusRunning, reply.Status)
			requireSameJSON(t, req.Input, run.Input)
		case dedupe.Existing.String():
			require.True(t, runID == "" || before.found, "existing reported for new run %s", reply.RunID)
			if before.found {
				require.Equal(t, before, after, "duplicate start changed run %s", runID)
			}
			require.GreaterOrEqual(t, reply.Duplicates, int64(1))
		default:
			t.Fatalf("reply without error or known outcome: %+v", reply)
		}
	})
}

// stored is a run record as read from the bucket.
type stored struct {
	found bool
	value []byte
	rev   uint64
}

func readRun(ctx context.Context, t *testing.T, assets *jetstream.Assets, runID string) stored {
	t.Helper()
	v, rev, err := assets.Runs.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return stored{}
	}
	require.NoError(t, err)
	return stored{found: true, value: v, rev: rev}
}
