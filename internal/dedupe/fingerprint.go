package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Fingerprint is the canonical hash of a start's workflow name and input:
// two starts have the same fingerprint when their workflow names are equal
// and their inputs are the same JSON value, whatever the key order and
// white space. Numbers are compared as written (1 and 1.0 differ). It is
// the hex SHA-256 of the canonical form {"input":<canonical>,"workflow":<name>}.
func Fingerprint(workflow string, input json.RawMessage) (string, error) {
	canon, err := Canonical(input)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(struct {
		Input    json.RawMessage `json:"input"`
		Workflow string          `json:"workflow"`
	}{canon, workflow})
	if err != nil {
		return "", fmt.Errorf("jetflow: fingerprint: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// Canonical re-encodes a JSON value with object keys sorted, no
// insignificant white space, no HTML escaping and numbers kept as written.
func Canonical(input json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: input: %w", state.ErrCorrupt, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps encode with sorted keys
		return nil, fmt.Errorf("jetflow: canonical input: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// maxFieldName is the longest field name a conflict names in full.
const maxFieldName = 64

// DiffFields names the top-level fields in which requested, a start's
// input, differs from stored, the run's: added (only requested has it),
// removed (only stored has it) or changed (the values' canonical forms
// differ, as their fingerprints would), sorted by name, at most
// jetflowtype.MaxConflictFields, and how many more differ. ok is false
// when either input is not a JSON object: there are no fields to name.
// Only names are returned, never values.
func DiffFields(stored, requested json.RawMessage) (diff []jetflowtype.FieldDiff, more int, ok bool) {
	var a, b map[string]json.RawMessage
	if !isObject(stored) || !isObject(requested) ||
		json.Unmarshal(stored, &a) != nil || json.Unmarshal(requested, &b) != nil {
		return nil, 0, false
	}
	names := make([]string, 0, len(a)+len(b))
	for name := range a {
		names = append(names, name)
	}
	for name := range b {
		if _, both := a[name]; !both {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		av, inA := a[name]
		bv, inB := b[name]
		var change string
		switch {
		case !inA:
			change = jetflowtype.FieldAdded
		case !inB:
			change = jetflowtype.FieldRemoved
		case !sameValue(av, bv):
			change = jetflowtype.FieldChanged
		default:
			continue
		}
		if len(diff) == jetflowtype.MaxConflictFields {
			more++
			continue
		}
		diff = append(diff, jetflowtype.FieldDiff{Name: clipName(name), Change: change})
	}
	return diff, more, true
}

// isObject reports whether the JSON value v is an object.
func isObject(v json.RawMessage) bool {
	v = bytes.TrimLeft(v, " \t\r\n")
	return len(v) > 0 && v[0] == '{'
}

// sameValue reports whether two JSON values are the same value as the
// fingerprint sees it.
func sameValue(a, b json.RawMessage) bool {
	ca, errA := Canonical(a)
	cb, errB := Canonical(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

// clipName cuts a field name over maxFieldName bytes, on a rune boundary,
// and marks it with "…", so that a conflict's error stays small.
func clipName(name string) string {
	if len(name) <= maxFieldName {
		return name
	}
	cut := maxFieldName
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}
