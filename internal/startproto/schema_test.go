package startproto

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// The JSON Schemas in docs/schema are what other languages code against.
// These tests tie them to the Go types and the decoder, so that neither can
// change without the other.

type schema struct {
	Properties           map[string]*schema         `json:"properties"`
	Required             []string                   `json:"required"`
	AdditionalProperties json.RawMessage            `json:"additionalProperties"` // false, or a schema
	MaxProperties        int                        `json:"maxProperties"`
	PropertyNames        *schema                    `json:"propertyNames"`
	Enum                 []string                   `json:"enum"`
	Pattern              string                     `json:"pattern"`
	MaxLength            int                        `json:"maxLength"`
	Description          string                     `json:"description"`
	Type                 string                     `json:"type"`
	DependentSchemas     map[string]json.RawMessage `json:"dependentSchemas"`
	Items                *schema                    `json:"items"`
	MaxItems             int                        `json:"maxItems"`
}

func loadSchema(t *testing.T, name string) *schema {
	t.Helper()
	b, err := os.ReadFile("../../docs/schema/" + name)
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw), "%s is not JSON", name)
	require.Equal(t, "https://json-schema.org/draft/2020-12/schema", raw["$schema"])
	var s schema
	require.NoError(t, json.Unmarshal(b, &s))
	return &s
}

// jsonTags returns the JSON names of v's fields and which are omitempty.
func jsonTags(v any) (names []string, omitempty map[string]bool) {
	omitempty = map[string]bool{}
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		tag := rt.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" {
			continue
		}
		names = append(names, name)
		omitempty[name] = strings.Contains(opts, "omitempty")
	}
	sort.Strings(names)
	return names, omitempty
}

func keys(m map[string]*schema) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	sort.Strings(out)
	return out
}

// The envelope's attributes schema states the limits the decoder enforces
// (state.ValidateAttributes).
func TestStartEnvelopeSchemaAttributes(t *testing.T) {
	t.Parallel()
	a := loadSchema(t, "start-envelope.schema.json").Properties["attributes"]
	require.NotNil(t, a)
	require.Equal(t, state.MaxAttributes, a.MaxProperties)
	require.Equal(t, "^[a-z][a-z0-9_]{0,31}$", a.PropertyNames.Pattern)
	var values schema
	require.NoError(t, json.Unmarshal(a.AdditionalProperties, &values))
	require.Equal(t, state.MaxAttributeValueLen, values.MaxLength)
	name := regexp.MustCompile(a.PropertyNames.Pattern)
	for _, n := range []string{"order_id", "a", "Order", "1a", "a.b", "a" + strings.Repeat("b", 31), "a" + strings.Repeat("b", 32)} {
		require.Equal(t, name.MatchString(n), state.ValidateAttributeName(n) == nil, n)
	}
	_, err := DecodeStartRequest("wf", []byte(`{"run_id":"k-1","input":1,"attributes":{"Order":"1"}}`), jetflowtype.ConflictPolicy{})
	require.ErrorIs(t, err, state.ErrInvalidAttributes)
	require.Equal(t, CodeBadAttrs, errorReply(err).Error.Code)
	req, err := DecodeStartRequest("wf", []byte(`{"run_id":"k-1","input":1,"attributes":{"order_id":"42"}}`), jetflowtype.ConflictPolicy{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"order_id": "42"}, req.Attributes)
}

func TestStartEnvelopeSchemaMatchesStartRequest(t *testing.T) {
	t.Parallel()
	s := loadSchema(t, "start-envelope.schema.json")
	names, _ := jsonTags(StartRequest{})
	require.Equal(t, names, keys(s.Properties), "envelope schema properties vs StartRequest JSON tags")
	require.Equal(t, "false", string(s.AdditionalProperties), "the decoder refuses unknown fields")

	// required lists exactly the fields the decoder cannot do without:
	// a minimal valid envelope missing that field is refused.
	minimal := map[string]any{"run_id": "k-1", "input": 1, "source": "s", "fingerprint": "strict", "policy": map[string]any{}}
	var required []string
	for _, name := range names {
		if name == "run_id" || name == "generate_run_id" {
			continue // one of the two, or (durable) the Nats-Msg-Id header: below
		}
		m := map[string]any{}
		for k, v := range minimal {
			if k != name {
				m[k] = v
			}
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		if _, err := DecodeStartRequest("w", b, jetflowtype.ConflictPolicy{}); err != nil {
			required = append(required, name)
		}
	}
	require.Equal(t, sorted(required), sorted(s.Required), "schema required vs the decoder")

	// run_id or generate_run_id, never both (dependentSchemas), and never
	// neither on request-reply.
	require.JSONEq(t, `{"not": {"required": ["run_id"]}}`, string(s.DependentSchemas["generate_run_id"]))
	for env, ok := range map[string]bool{
		`{"run_id":"k-1"}`: true, `{"generate_run_id":true}`: true, `{}`: false,
		`{"run_id":"k-1","generate_run_id":true}`: false, `{"run_id":""}`: false, `{"run_id":null}`: false,
	} {
		_, err := DecodeStartRequest("w", []byte(env), jetflowtype.ConflictPolicy{})
		require.Equal(t, ok, err == nil, "%s: %v", env, err)
	}

	// run_id: the pattern agrees with ValidateRunID.
	re := regexp.MustCompile(s.Properties["run_id"].Pattern)
	for _, id := range []string{"a", "stripe-evt_123", "b64==", strings.Repeat("x", 128), "", strings.Repeat("x", 129), "a.b", "a b", "a*", "é"} {
		require.Equal(t, state.ValidateRunID(id) == nil, re.MatchString(id), "run ID %q", id)
	}
	require.Equal(t, state.MaxSourceLen, s.Properties["source"].MaxLength)
	require.Contains(t, s.Properties["input"].Description, strconv.Itoa(state.MaxInputBytes))

	// fingerprint: the enumeration is what the decoder accepts.
	for _, fp := range s.Properties["fingerprint"].Enum {
		_, err := DecodeStartRequest("w", []byte(`{"run_id":"k-1","fingerprint":"`+fp+`"}`), jetflowtype.ConflictPolicy{})
		require.NoError(t, err, fp)
	}
	_, err := DecodeStartRequest("w", []byte(`{"run_id":"k-1","fingerprint":"other"}`), jetflowtype.ConflictPolicy{})
	require.Error(t, err)

	// policy: fields and values.
	ps := s.Properties["policy"]
	pnames, _ := jsonTags(dedupe.EnvelopePolicy{})
	require.Equal(t, pnames, keys(ps.Properties))
	require.Equal(t, "false", string(ps.AdditionalProperties))
	// Every constant spelt as the envelope spells it, in the constants'
	// order; the value after the last is refused.
	var runningNames, endedNames []string
	for v := jetflowtype.Attach; ; v++ {
		e, err := dedupe.EnvelopeFromPolicy(jetflowtype.ConflictPolicy{WhileRunning: v})
		if err != nil {
			break
		}
		runningNames = append(runningNames, e.WhileRunning)
	}
	for v := jetflowtype.ReturnExisting; ; v++ {
		e, err := dedupe.EnvelopeFromPolicy(jetflowtype.ConflictPolicy{AfterCompleted: v})
		if err != nil {
			break
		}
		endedNames = append(endedNames, e.AfterCompleted)
	}
	require.Equal(t, runningNames, ps.Properties["while_running"].Enum)
	require.Equal(t, endedNames, ps.Properties["after_completed"].Enum)
	require.Equal(t, endedNames, ps.Properties["after_failed"].Enum)
}

func TestStartReplySchemaMatchesStartReply(t *testing.T) {
	t.Parallel()
	s := loadSchema(t, "start-reply.schema.json")
	names, _ := jsonTags(StartReply{})
	require.Equal(t, names, keys(s.Properties), "reply schema properties vs StartReply JSON tags")
	require.Equal(t, "false", string(s.AdditionalProperties))

	es := s.Properties["error"]
	enames, omit := jsonTags(ReplyError{})
	require.Equal(t, enames, keys(es.Properties))
	var always []string
	for _, n := range enames {
		if !omit[n] {
			always = append(always, n)
		}
	}
	require.Equal(t, sorted(always), sorted(es.Required))
	require.Equal(t, sorted(ReplyCodes), sorted(es.Properties["code"].Enum))

	// The conflict's detail: ReplyConflict, and its fields' FieldDiff.
	cs := es.Properties["conflict"]
	require.NotNil(t, cs, "error.conflict")
	cnames, comit := jsonTags(ReplyConflict{})
	require.Equal(t, cnames, keys(cs.Properties))
	require.Equal(t, "false", string(cs.AdditionalProperties))
	always = nil
	for _, n := range cnames {
		if !comit[n] {
			always = append(always, n)
		}
	}
	require.Equal(t, sorted(always), sorted(cs.Required))
	require.Equal(t, []string{"workflow", "input"}, cs.Properties["field"].Enum)
	fs := cs.Properties["fields"]
	require.NotNil(t, fs)
	require.Equal(t, jetflowtype.MaxConflictFields, fs.MaxItems)
	items := fs.Items
	require.NotNil(t, items)
	fnames, _ := jsonTags(jetflowtype.FieldDiff{})
	require.Equal(t, fnames, keys(items.Properties))
	require.Equal(t, sorted(fnames), sorted(items.Required))
	require.Equal(t, []string{jetflowtype.FieldAdded, jetflowtype.FieldRemoved, jetflowtype.FieldChanged}, items.Properties["change"].Enum)

	require.Equal(t, []string{dedupe.Created.String(), dedupe.Existing.String(), dedupe.Restarted.String(), dedupe.Superseded.String()}, s.Properties["outcome"].Enum)
	var statuses []string
	for _, st := range []state.Status{state.StatusRunning, state.StatusCompleted, state.StatusFailed, state.StatusCancelled} {
		statuses = append(statuses, string(st))
	}
	require.Equal(t, statuses, s.Properties["status"].Enum)
}
