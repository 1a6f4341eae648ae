package eventproto_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/state"
)

// The JSON Schemas of the event protocol (docs/schema/event-*.schema.json)
// are what clients in other languages code against. These tests tie them
// to the Go types and the decoder, and a real JSON Schema implementation
// (santhosh-tekuri/jsonschema, draft 2020-12) checks envelopes and the
// replies real workers send against them.

const (
	envelopeSchema = "../../docs/schema/event-envelope.schema.json"
	replySchema    = "../../docs/schema/event-reply.schema.json"
)

// schemaDoc is the part of a schema the tests compare with the Go side.
type schemaDoc struct {
	Schema               string                `json:"$schema"`
	Properties           map[string]*schemaDoc `json:"properties"`
	Required             []string              `json:"required"`
	AdditionalProperties *bool                 `json:"additionalProperties"`
	Enum                 []string              `json:"enum"`
	Pattern              string                `json:"pattern"`
	MaxLength            int                   `json:"maxLength"`
	Description          string                `json:"description"`
}

func readSchema(t *testing.T, path string) *schemaDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var s schemaDoc
	require.NoError(t, json.Unmarshal(b, &s), "%s is not JSON", path)
	require.Equal(t, "https://json-schema.org/draft/2020-12/schema", s.Schema)
	require.NotNil(t, s.AdditionalProperties)
	require.False(t, *s.AdditionalProperties, "%s: unknown fields are refused", path)
	return &s
}

// compiled loads a schema with the validator, once per test binary.
var compiled = sync.OnceValues(func() (map[string]*jsonschema.Schema, error) {
	out := map[string]*jsonschema.Schema{}
	for _, path := range []string{envelopeSchema, replySchema} {
		s, err := jsonschema.NewCompiler().Compile(path)
		if err != nil {
			return nil, err
		}
		out[path] = s
	}
	return out, nil
})

// validate reports whether doc conforms to the schema at path.
func validate(t *testing.T, path string, doc []byte) error {
	t.Helper()
	schemas, err := compiled()
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	require.NoError(t, err, "%s", doc)
	return schemas[path].Validate(inst)
}

// requireReply fails unless reply conforms to the reply schema.
func requireReply(t *testing.T, reply []byte) {
	t.Helper()
	require.NoError(t, validate(t, replySchema, reply), "reply %s", reply)
}

// jsonNames returns the JSON names of v's fields, sorted.
func jsonNames(v any) []string {
	var names []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func keysOf(m map[string]*schemaDoc) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestEventEnvelopeSchemaMatchesDecode(t *testing.T) {
	t.Parallel()
	s := readSchema(t, envelopeSchema)
	require.Equal(t, jsonNames(eventproto.Request{}), keysOf(s.Properties), "schema properties vs Request JSON tags")

	// The patterns agree with the validators.
	for field, check := range map[string]func(string) error{
		"run_id": state.ValidateRunID, "name": state.ValidateName, "token": state.ValidateHookToken, "event_id": state.ValidateEventID,
	} {
		re := regexp.MustCompile(s.Properties[field].Pattern)
		for _, v := range []string{"a", "order-42", "b64==", "evt_1NG8Du2eZvKYlo2C", strings.Repeat("x", 64), strings.Repeat("x", 65),
			strings.Repeat("x", 128), strings.Repeat("x", 129), "", "a.b", "a b", "a*", "é", "tab\there", "nul\x00"} {
			want := check(v) == nil
			got := re.MatchString(v)
			if field == "event_id" { // a length in bytes: maxLength is checked apart
				got = got && len(v) <= s.Properties[field].MaxLength
			}
			require.Equal(t, want, got, "%s %q", field, v)
		}
	}
	require.Equal(t, state.MaxEventIDLen, s.Properties["event_id"].MaxLength)
	require.Contains(t, s.Properties["payload"].Description, strconv.Itoa(state.MaxInputBytes))

	// What the schema accepts, the decoder accepts, and the other way
	// round, for the envelope's shape.
	for env, ok := range map[string]bool{
		`{"run_id":"r-1","name":"go","event_id":"e1","payload":{"a":1}}`:  true,
		`{"run_id":"r-1","name":"go","event_id":"e1"}`:                    true,
		`{"token":"order-1-payment","event_id":"evt.1:x","payload":null}`: true,
		`{"token":"t","event_id":"e"}`:                                    true,
		`{"event_id":"e1"}`:                                               false,
		`{"run_id":"r-1","event_id":"e1"}`:                                false,
		`{"name":"go","event_id":"e1"}`:                                   false,
		`{"token":"t","name":"go","event_id":"e1"}`:                       false,
		`{"token":"t","run_id":"r-1","name":"go","event_id":"e1"}`:        false,
		`{"token":"t"}`:                                               false,
		`{"token":"t","event_id":""}`:                                 false,
		`{"token":"t.x","event_id":"e"}`:                              false,
		`{"run_id":"r 1","name":"go","event_id":"e"}`:                 false,
		`{"run_id":"r-1","name":"go.x","event_id":"e"}`:               false,
		`{"token":"t","event_id":"e","runId":"r"}`:                    false,
		`{"token":"t","event_id":"` + strings.Repeat("x", 257) + `"}`: false,
		`{"token":"t","event_id":"a\u0001b"}`:                         false,
	} {
		_, err := eventproto.Decode([]byte(env))
		require.Equal(t, ok, err == nil, "decoder on %s: %v", env, err)
		require.Equal(t, ok, validate(t, envelopeSchema, []byte(env)) == nil, "schema on %s", env)
	}
}

func TestEventReplySchemaMatchesReply(t *testing.T) {
	t.Parallel()
	s := readSchema(t, replySchema)
	require.Equal(t, jsonNames(eventproto.Reply{}), keysOf(s.Properties), "schema properties vs Reply JSON tags")
	es := s.Properties["error"]
	require.Equal(t, jsonNames(eventproto.ReplyError{}), keysOf(es.Properties))
	require.Equal(t, []string{"code", "message"}, es.Required)
	require.Equal(t, eventproto.Codes, es.Properties["code"].Enum, "the code enumeration is eventproto.Codes, in order")
	require.Equal(t, []string{eventproto.OutcomeDelivered, eventproto.OutcomeDuplicate}, s.Properties["outcome"].Enum)
	require.Equal(t, []string{string(state.StatusCompleted), string(state.StatusFailed), string(state.StatusCancelled)},
		s.Properties["run_status"].Enum, "the states of an ended run")

	// Every code is a valid reply; an unknown code, or an outcome beside
	// an error, is not.
	for _, code := range eventproto.Codes {
		b, err := json.Marshal(eventproto.Reply{EventID: "e", Error: &eventproto.ReplyError{Code: code, Message: "m"}})
		require.NoError(t, err)
		requireReply(t, b)
	}
	for _, bad := range []string{
		`{"error":{"code":"nope","message":"m"}}`,
		`{"outcome":"delivered","run_id":"r","workflow":"w","step_id":"s","event_id":"e","error":{"code":"internal","message":"m"}}`,
		`{"outcome":"delivered","run_id":"r"}`,
		`{}`,
	} {
		require.Error(t, validate(t, replySchema, []byte(bad)), bad)
	}
}
