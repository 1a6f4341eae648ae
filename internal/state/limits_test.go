package state

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// worstInput is a JSON string of exactly MaxInputBytes bytes made of the
// characters encoding/json would escape by default ('<', '>', '&', U+2028):
// the input that grew six-fold in a task when records were HTML-escaped.
func worstInput() json.RawMessage {
	body := strings.Repeat("<>&\u2028", MaxInputBytes/6)
	body += strings.Repeat("<", MaxInputBytes-2-len(body))
	return json.RawMessage(`"` + body + `"`)
}

// maximalAttributes is the largest attribute set a start may carry, in
// encoded bytes: MaxAttributes names of the longest length, each value
// MaxAttributeValueLen '"' characters (each escaped to two bytes).
func maximalAttributes() map[string]string {
	attrs := map[string]string{}
	for i := range MaxAttributes {
		attrs[string(rune('a'+i))+strings.Repeat("z", MaxAttributeNameLen-1)] = strings.Repeat(`"`, MaxAttributeValueLen)
	}
	return attrs
}

// The largest start jetflow accepts fits, with its step tasks and its run
// record, in a NATS message of the default max_payload, with room to spare.
func TestMaximalStartFitsInANATSMessage(t *testing.T) {
	t.Parallel()
	input := worstInput()
	require.Len(t, input, MaxInputBytes)
	runID := strings.Repeat("r", MaxRunIDLen)
	name := strings.Repeat("n", MaxNameLen)
	start := Task{
		V: Version, RunID: runID, Workflow: name, Input: input,
		Token:      "ABCDEFGHIJKLMNOPQRSTUV", // a nuid
		Source:     strings.Repeat("\x01", MaxSourceLen),
		Attributes: maximalAttributes(),
	}
	require.NoError(t, ValidateAttributes(start.Attributes))
	b, err := Encode(start)
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), MaxStartTaskBytes)
	require.True(t, bytes.Contains(b, input), "the input is carried as it came, not escaped")
	overhead := len(b) - len(input)
	t.Logf("start task envelope (everything but the input): %d bytes", overhead)
	require.Less(t, overhead, 4*1024, "envelope of a start task with a maximal source")
	decoded, err := DecodeTask(b)
	require.NoError(t, err)
	require.Equal(t, string(input), string(decoded.Input))

	at := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -(23*3600+59*60)))
	step := start
	step.StepID = StepID(runID, name, math.MaxInt)
	step.CreatedAt, step.Rev = at, math.MaxUint64
	sb, err := Encode(step)
	require.NoError(t, err)
	require.LessOrEqual(t, len(sb), MaxRecordBytes)
	require.Less(t, len(sb)-len(b), MaxRecordBytes-MaxStartTaskBytes, "a step task adds less than the start task's margin")

	run := RunFromTask(step)
	run.UpdatedAt, run.Status = at, StatusCancelled
	for range MaxPredecessors { // a generation after many, each after an expiry (the largest numbers)
		run.Predecessors = append(run.Predecessors, Predecessor{Generation: math.MaxInt, Token: start.Token, Status: StatusCancelled})
	}
	rb, err := Encode(run)
	require.NoError(t, err)
	require.Less(t, len(rb)-len(b), MaxRecordBytes-MaxStartTaskBytes, "a run record adds less than the start task's margin")

	// What is left in the final run record for the run's output: about
	// 500 KiB (less the predecessors of a generation after many).
	require.Greater(t, MaxRecordBytes-len(rb), 500*1000)
	t.Logf("maximal start task %d bytes (envelope %d), step task %d, run record %d, left for output %d",
		len(b), overhead, len(sb), len(rb), MaxRecordBytes-len(rb))

	// Headers of a task message with the longest run ID fit in what
	// MaxRecordBytes leaves of the NATS payload.
	hdr := "NATS/1.0\r\nNats-Msg-Id: " + runID + "\r\nNats-Expected-Stream: JETFLOW_TASKS\r\n\r\n"
	require.Less(t, len(hdr), NATSMaxPayload-MaxRecordBytes)
}

func TestEncodeRefusesRecordsOverTheLimit(t *testing.T) {
	t.Parallel()
	input := json.RawMessage(`"` + strings.Repeat("x", MaxInputBytes-2) + `"`)
	big := Task{V: Version, RunID: "r", Workflow: "w", Input: input, Token: "t", Source: strings.Repeat("s", MaxStartTaskBytes-MaxInputBytes)}
	_, err := Encode(big)
	require.ErrorIs(t, err, ErrInputTooLarge)
	_, err = Encode(&big)
	require.ErrorIs(t, err, ErrInputTooLarge, "through a pointer too")

	// The same task as a step task is under the record limit.
	big.StepID = "r.a.0"
	_, err = Encode(big)
	require.NoError(t, err)

	huge := Run{V: Version, RunID: "r", Workflow: "w", Status: StatusCompleted, Input: input, Output: input}
	_, err = Encode(huge)
	require.ErrorIs(t, err, ErrInputTooLarge)
}

func TestEncodeOnlyCompactsPayloads(t *testing.T) {
	t.Parallel()
	b, err := Encode(Step{StepID: "r.a.0", RunID: "r", Name: "a", Output: json.RawMessage("{ \"html\" : \"<b>&amp;</b>\" ,\n \"ls\":\"\u2028\" }")})
	require.NoError(t, err)
	require.Contains(t, string(b), `"output":{"html":"<b>&amp;</b>","ls":"`+"\u2028"+`"}`)
	require.False(t, bytes.HasSuffix(b, []byte("\n")))
}

func TestValidateSource(t *testing.T) {
	t.Parallel()
	require.NoError(t, ValidateSource(""))
	require.NoError(t, ValidateSource(strings.Repeat("s", MaxSourceLen)))
	require.ErrorIs(t, ValidateSource(strings.Repeat("s", MaxSourceLen+1)), ErrInputTooLarge)
}

func TestStepIDsAreValidatedOnDecode(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{StepID("r", "a", 0), StepID("b64==", "send-email", 12), StepID(strings.Repeat("r", MaxRunIDLen), strings.Repeat("n", MaxNameLen), math.MaxInt)} {
		runID, _, _ := strings.Cut(ok, ".")
		name, err := validateStepID(runID, ok)
		require.NoError(t, err, ok)
		require.Equal(t, ok[len(runID)+1:len(runID)+1+len(name)], name)
	}
	for _, bad := range []string{"r", "r.a", "r.a.", "r..0", "r.a.b.0", "s.a.0", "r.a.01", "r.a.-1", "r.a.+1", "r.a.x", "r.a=b.0", "r.a.9223372036854775808"} {
		_, err := validateStepID("r", bad)
		require.Error(t, err, bad)
	}
	_, err := DecodeStep([]byte(`{"step_id":"r.a.0","run_id":"r","name":"b"}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeTask([]byte(`{"run_id":"r","workflow":"w","step_id":"x.a.0","input":1}`))
	require.ErrorIs(t, err, ErrCorrupt)
	s, err := DecodeStep([]byte(`{"v":1,"step_id":"r.a.3","run_id":"r","name":"a","seq":5,"attempt":2}`))
	require.NoError(t, err)
	require.Equal(t, "a", s.Name)
}

// Found by the FuzzDecodeRun seed corpus: time.Time decodes a zone offset
// of +24:00 and then refuses to encode it, so such a record decoded but
// could never be written back. Every decoder now rejects it as corrupt.
func TestDecodersRejectTimesThatCannotBeWrittenBack(t *testing.T) {
	t.Parallel()
	const ts = `"2024-01-01T00:00:00+24:00"`
	var probe time.Time
	require.NoError(t, json.Unmarshal([]byte(ts), &probe), "the standard library accepts it")
	_, err := probe.MarshalJSON()
	require.Error(t, err, "and cannot encode it")

	_, err = DecodeRun([]byte(`{"run_id":"r","workflow":"w","status":"running","input":1,"updated_at":` + ts + `}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeTask([]byte(`{"run_id":"r","workflow":"w","token":"t","input":1,"created_at":` + ts + `}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeStep([]byte(`{"step_id":"r.a.0","run_id":"r","name":"a","committed_at":` + ts + `}`))
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = DecodeAudit([]byte(`{"duplicates":1,"last":` + ts + `}`))
	require.ErrorIs(t, err, ErrCorrupt)
}
