package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/jetflow/jetflow/internal/state"
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
