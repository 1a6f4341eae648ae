package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jetflow/jetflow/internal/state"
)

// ErrNoToken: a delivery whose event type resumes a hook (Source.Resume)
// but whose body does not give a valid hook token through the rule's
// template: a field is missing, is not a string or an integer, or its
// value holds a character a token cannot (only [A-Za-z0-9_=-]), or the
// token is longer than 128 characters.
var ErrNoToken = errors.New("webhook: the event gives no hook token")

// Resume makes events of one type resume a hook instead of starting the
// source's workflow: the token is Token applied to the event's body, the
// event ID is the provider's, the payload is the body.
type Resume struct {
	// Type is the provider's event type (Event.Type), compared exactly:
	// "payment_intent.succeeded".
	Type string
	// Token derives the hook token from the event's body.
	Token TokenTemplate
}

// ResumeFor returns the rule of s that resumes a hook for ev's type, if
// any. An event of no rule's type starts s.Workflow.
func (s Source) ResumeFor(ev Event) (Resume, bool) {
	for _, r := range s.Resume {
		if ev.Type != "" && r.Type == ev.Type {
			return r, true
		}
	}
	return Resume{}, false
}

// validateResume checks s.Resume: rules only for schemes that sign the
// event type, each with a type, given once, and a parsed template.
func (s Source) validateResume() error {
	if len(s.Resume) == 0 {
		return nil
	}
	if s.Provider == GitHub {
		// X-GitHub-Event is not signed: a captured body could be replayed
		// under another event type and resume a hook with it.
		return fmt.Errorf("%w: Resume: GitHub does not sign the event type (X-GitHub-Event); resume hooks from Stripe or Standard Webhooks sources", ErrInvalidSource)
	}
	seen := make(map[string]bool, len(s.Resume))
	for i, r := range s.Resume {
		switch {
		case r.Type == "":
			return fmt.Errorf("%w: Resume[%d]: empty event type", ErrInvalidSource, i)
		case seen[r.Type]:
			return fmt.Errorf("%w: Resume[%d]: event type %q is given twice", ErrInvalidSource, i, clip(r.Type))
		case r.Token.parts == nil:
			return fmt.Errorf("%w: Resume[%d]: no token template", ErrInvalidSource, i)
		}
		seen[r.Type] = true
	}
	return nil
}

// TokenTemplate derives a hook token from a JSON event body. Its text is
// literal token characters ([A-Za-z0-9_=-]) and placeholders {path}, where
// path names a field of the body by its keys, separated by dots
// (data.object.metadata.order_id; a key of digits indexes an array). Each
// placeholder is replaced by the field's value, which must be a string or
// an integer made of token characters. The zero TokenTemplate is invalid:
// make one with ParseTokenTemplate.
type TokenTemplate struct {
	raw   string
	parts []templatePart
}

// templatePart is a literal (path nil) or a placeholder.
type templatePart struct {
	literal string
	path    []string
}

// ParseTokenTemplate parses s, refusing a template that can never give a
// valid hook token: an empty one, one without a placeholder (every event
// would resume the same hook), a literal character outside
// [A-Za-z0-9_=-], an unbalanced brace, an empty path or key, a key with a
// character outside [A-Za-z0-9_-], two placeholders with no literal
// between them (their values' boundary would be lost: {a}{b} gives the
// same token for "x","yz" and "xy","z"), or literals so long that the
// shortest token would exceed 128 characters. Errors match
// ErrInvalidSource.
func ParseTokenTemplate(s string) (TokenTemplate, error) {
	bad := func(format string, args ...any) (TokenTemplate, error) {
		return TokenTemplate{}, fmt.Errorf("%w: token template %q: "+format, append([]any{ErrInvalidSource, clip(s)}, args...)...)
	}
	t := TokenTemplate{raw: s, parts: []templatePart{}}
	placeholders, minLen := 0, 0
	for rest := s; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		switch {
		case open < 0:
			open = len(rest)
		case rest[open] == '}':
			return bad("'}' without '{'")
		}
		if lit := rest[:open]; lit != "" {
			if i := strings.IndexFunc(lit, func(r rune) bool { return !tokenChar(r) }); i >= 0 {
				return bad("%q cannot be part of a hook token (only A-Z a-z 0-9 _ = -)", []rune(lit[i:])[0])
			}
			t.parts = append(t.parts, templatePart{literal: lit})
			minLen += len(lit)
		}
		rest = rest[open:]
		if rest == "" {
			break
		}
		end := strings.IndexAny(rest[1:], "{}")
		if end < 0 || rest[1+end] != '}' {
			return bad("'{' without '}'")
		}
		path := rest[1 : 1+end]
		if path == "" {
			return bad("empty placeholder {}")
		}
		keys := strings.Split(path, ".")
		for _, k := range keys {
			if k == "" || strings.IndexFunc(k, func(r rune) bool { return !keyChar(r) }) >= 0 {
				return bad("placeholder {%s}: keys are 1 or more of A-Z a-z 0-9 _ - separated by dots", path)
			}
		}
		if n := len(t.parts); n > 0 && t.parts[n-1].path != nil {
			return bad("placeholders {%s} and {%s} need a literal between them", strings.Join(t.parts[n-1].path, "."), path)
		}
		t.parts = append(t.parts, templatePart{path: keys})
		placeholders++
		minLen++
		rest = rest[2+end:]
	}
	switch {
	case s == "":
		return bad("empty")
	case placeholders == 0:
		return bad("no {field} placeholder: every event would resume the same hook")
	case minLen > state.MaxRunIDLen:
		return bad("at least %d characters, longer than a hook token may be (%d)", minLen, state.MaxRunIDLen)
	}
	return t, nil
}

// tokenChar reports whether r may be part of a hook token.
func tokenChar(r rune) bool { return keyChar(r) || r == '=' }

// keyChar reports whether r may be part of a placeholder's key.
func keyChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
}

// String is the template's text.
func (t TokenTemplate) String() string { return t.raw }

// Token applies t to body, a JSON object: the same body always gives the
// same token. Errors match ErrNoToken and name the field, never quoting
// more than 64 bytes of a value.
func (t TokenTemplate) Token(body []byte) (string, error) {
	if t.parts == nil {
		return "", fmt.Errorf("%w: no token template", ErrNoToken)
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return "", fmt.Errorf("%w: the body is not JSON: %w", ErrNoToken, err)
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.path == nil {
			b.WriteString(p.literal)
			continue
		}
		v, err := lookup(doc, p.path)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
	}
	token := b.String()
	if err := state.ValidateHookToken(token); err != nil {
		return "", fmt.Errorf("%w: template %s: %w", ErrNoToken, t.raw, err)
	}
	return token, nil
}

// lookup is the value at path in doc, as a token part.
func lookup(doc any, path []string) (string, error) {
	name := strings.Join(path, ".")
	v := doc
	for _, k := range path {
		switch c := v.(type) {
		case map[string]any:
			next, ok := c[k]
			if !ok {
				return "", fmt.Errorf("%w: the body has no field %s", ErrNoToken, name)
			}
			v = next
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(c) {
				return "", fmt.Errorf("%w: the body has no field %s", ErrNoToken, name)
			}
			v = c[i]
		default:
			return "", fmt.Errorf("%w: the body has no field %s", ErrNoToken, name)
		}
	}
	var s string
	switch c := v.(type) {
	case string:
		s = c
	case json.Number:
		if _, err := strconv.ParseInt(c.String(), 10, 64); err != nil {
			return "", fmt.Errorf("%w: field %s is %s, not an integer", ErrNoToken, name, clip(c.String()))
		}
		s = c.String()
	default:
		return "", fmt.Errorf("%w: field %s is not a string or an integer", ErrNoToken, name)
	}
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return !tokenChar(r) }) >= 0 {
		return "", fmt.Errorf("%w: field %s is %q, which cannot be part of a hook token (1 or more of A-Z a-z 0-9 _ = -)", ErrNoToken, name, clip(s))
	}
	return s, nil
}
