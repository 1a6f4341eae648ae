package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jetflow/jetflow/internal/state"
)

// Pointer is a JSON pointer (RFC 6901) into an event's payload, parsed:
// "/data/object/metadata/order_id" is the tokens data, object, metadata,
// order_id ("~1" stands for "/" in a token, "~0" for "~").
type Pointer struct {
	text   string
	tokens []string
}

// ParsePointer parses a JSON pointer: "" (the whole payload) or "/"
// followed by tokens separated by "/". A "~" not followed by 0 or 1 is
// an error.
func ParsePointer(text string) (Pointer, error) {
	if text == "" {
		return Pointer{}, nil
	}
	if !strings.HasPrefix(text, "/") {
		return Pointer{}, fmt.Errorf("%w: JSON pointer %q: want \"\" or one starting with /", ErrInvalidSource, clip(text))
	}
	parts := strings.Split(text[1:], "/")
	for i, p := range parts {
		for j := 0; j < len(p); j++ {
			if p[j] == '~' && (j+1 == len(p) || (p[j+1] != '0' && p[j+1] != '1')) {
				return Pointer{}, fmt.Errorf("%w: JSON pointer %q: ~ must be followed by 0 or 1", ErrInvalidSource, clip(text))
			}
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	return Pointer{text: text, tokens: parts}, nil
}

// String is the pointer as written.
func (p Pointer) String() string { return p.text }

// resolve returns the value p points at in doc (decoded with UseNumber),
// and whether there is one.
func (p Pointer) resolve(doc any) (any, bool) {
	for _, tok := range p.tokens {
		switch v := doc.(type) {
		case map[string]any:
			var ok bool
			if doc, ok = v[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) || strconv.Itoa(i) != tok {
				return nil, false
			}
			doc = v[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// validateAttributes checks a source's attribute pointers: at most
// state.MaxAttributes, each name a valid attribute name.
func validateAttributes(attrs map[string]Pointer) error {
	if len(attrs) > state.MaxAttributes {
		return fmt.Errorf("%w: Attributes: %d, limit %d", ErrInvalidSource, len(attrs), state.MaxAttributes)
	}
	for name := range attrs {
		if err := state.ValidateAttributeName(name); err != nil {
			return fmt.Errorf("%w: Attributes: %w", ErrInvalidSource, err)
		}
	}
	return nil
}

// AttributesOf reads the source's attributes (Source.Attributes) from an
// event's payload: for each name, the value its pointer points at — a
// string as it is, a number or a boolean as its JSON text. An attribute
// the payload cannot give is left out, and the run starts without it: a
// pointer that does not resolve, a value that is null, an object or an
// array, or one outside the attribute limits (empty, over 64 bytes, a
// control character). A verified event is never refused for its
// attributes: the provider would redeliver it for ever. A payload that is
// not JSON gives none. The result is nil when nothing was found.
func (s Source) AttributesOf(payload []byte) map[string]string {
	if len(s.Attributes) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	var out map[string]string
	for name, p := range s.Attributes {
		v, ok := p.resolve(doc)
		if !ok {
			continue
		}
		var text string
		switch v := v.(type) {
		case string:
			text = v
		case json.Number:
			text = v.String()
		case bool:
			text = strconv.FormatBool(v)
		default:
			continue
		}
		if state.ValidateAttribute(name, text) != nil {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = text
	}
	return out
}
