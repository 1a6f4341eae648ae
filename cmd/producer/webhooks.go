package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/jetflow/jetflow/internal/server/config"
	"github.com/jetflow/jetflow/internal/server/webhook"
)

// Errors of a --webhooks file, matched with errors.Is on its
// *config.FileError (webhooksFileError). Problems with a source's fields match
// webhook.ErrInvalidSource instead.
var (
	// errWebhooksMalformed: not YAML, or not a list of maps of scalars.
	errWebhooksMalformed = errors.New("malformed webhooks file")
	// errUnknownField: a key that is no field of a source.
	errUnknownField = errors.New("unknown field")
	// errEmptySecretEnv: a secret_env variable that is unset or empty.
	errEmptySecretEnv = errors.New("environment variable is empty or unset")
	// errNameCollision: two sources with one name, or names whose run IDs
	// could meet ("stripe" and "stripe-eu").
	errNameCollision = errors.New("colliding source names")
)

// webhooksFileError is a problem with the --webhooks file or one of its
// sources: a *config.FileError whose message reads `webhooks file PATH line
// N: source "S": reason`, naming the file, the line and the field where
// known, and never holding a secret.
func webhooksFileError(path string, line int, source string, err error) error {
	return &config.FileError{Path: path, Line: line, Key: source, Err: err, Kind: "webhooks file", KeyKind: "source"}
}

// sourceFields are the keys of one source in a --webhooks file.
var sourceFields = []string{"name", "provider", "workflow", "secret_env", "secrets", "tolerance", "resume", "attributes"}

// resumeFields are the keys of one item of a source's resume list.
var resumeFields = []string{"type", "token"}

// loadWebhooks reads the --webhooks file at path: a YAML list of sources
// (see the package documentation), decoded strictly. Secrets come inline
// (secrets) or from the environment through getenv (secret_env), each a
// string or a list; an unset or empty variable is an error naming it. Every
// source is validated (webhook.Source.Validate); names must be unique, and
// no name may be another's followed by "-", since their run IDs
// "<name>-<event id>" could meet (webhook.Source.RunID).
func loadWebhooks(path string, getenv func(string) string) ([]webhook.Source, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, webhooksFileError(path, 0, "", err)
	}
	fail := func(line int, source string, err error) error {
		return webhooksFileError(path, line, source, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fail(0, "", fmt.Errorf("%w: %w", errWebhooksMalformed, err))
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, fail(next.Line, "", fmt.Errorf("%w: want one YAML document", errWebhooksMalformed))
	}
	if len(doc.Content) == 0 {
		return nil, fail(0, "", fmt.Errorf("%w: no sources", errWebhooksMalformed))
	}
	list := doc.Content[0]
	if list.Kind != yaml.SequenceNode {
		return nil, fail(list.Line, "", fmt.Errorf("%w: want a list of sources", errWebhooksMalformed))
	}
	if len(list.Content) == 0 {
		return nil, fail(list.Line, "", fmt.Errorf("%w: no sources", errWebhooksMalformed))
	}

	sources := make([]webhook.Source, 0, len(list.Content))
	lines := make([]int, 0, len(list.Content))
	for _, item := range list.Content {
		src, lerr := decodeSource(item, getenv)
		if lerr != nil {
			return nil, fail(lerr.line, src.Name, lerr.err)
		}
		if err := src.Validate(); err != nil {
			return nil, fail(item.Line, src.Name, err)
		}
		sources = append(sources, src)
		lines = append(lines, item.Line)
	}
	for i, a := range sources {
		for j, b := range sources {
			switch {
			case i < j && a.Name == b.Name:
				return nil, fail(lines[j], b.Name, fmt.Errorf("%w: the name is used twice (also on line %d)", errNameCollision, lines[i]))
			case i != j && strings.HasPrefix(b.Name, a.Name+"-"):
				return nil, fail(lines[j], b.Name, fmt.Errorf(
					"%w: the run IDs of %q (%s-<event id>) could equal those of %q (line %d); rename one",
					errNameCollision, b.Name, b.Name, a.Name, lines[i]))
			}
		}
	}
	return sources, nil
}

// lineError is an error at a line of the file.
type lineError struct {
	line int
	err  error
}

// decodeSource decodes one list item into a source, reading the secrets
// of secret_env through getenv. On error the source holds the name if it
// was read.
func decodeSource(item *yaml.Node, getenv func(string) string) (webhook.Source, *lineError) {
	var src webhook.Source
	if item.Kind != yaml.MappingNode {
		return src, &lineError{item.Line, fmt.Errorf("%w: a source must be a map of fields", errWebhooksMalformed)}
	}
	// The name first, so that errors about the other fields can name the source.
	for i := 0; i+1 < len(item.Content); i += 2 {
		if k, v := item.Content[i], item.Content[i+1]; k.Value == "name" && v.Kind == yaml.ScalarNode {
			src.Name = v.Value
		}
	}
	seen := make(map[string]bool)
	var secretEnv []string
	var tolerance *yaml.Node
	for i := 0; i+1 < len(item.Content); i += 2 {
		k, v := item.Content[i], item.Content[i+1]
		field := k.Value
		bad := func(format string, args ...any) *lineError {
			return &lineError{k.Line, fmt.Errorf("field %s: "+format, append([]any{field}, args...)...)}
		}
		switch {
		case k.Kind != yaml.ScalarNode:
			return src, &lineError{k.Line, fmt.Errorf("%w: a field name must be a string", errWebhooksMalformed)}
		case seen[field]:
			return src, bad("%w: given twice", errWebhooksMalformed)
		}
		seen[field] = true
		var err error
		switch field {
		case "name", "provider", "workflow":
			var s []string
			if s, err = scalars(v, false); err == nil {
				switch field {
				case "name":
					src.Name = s[0]
				case "provider":
					src.Provider = webhook.Provider(s[0])
				case "workflow":
					src.Workflow = s[0]
				}
			}
		case "tolerance":
			tolerance = v
			_, err = scalars(v, false)
		case "secret_env":
			secretEnv, err = scalars(v, true)
		case "secrets":
			src.Secrets, err = scalars(v, true)
		case "resume":
			var lerr *lineError
			if src.Resume, lerr = decodeResume(v); lerr != nil {
				return src, lerr
			}
		case "attributes":
			var lerr *lineError
			if src.Attributes, lerr = decodeAttributes(v); lerr != nil {
				return src, lerr
			}
		default:
			return src, &lineError{k.Line, fmt.Errorf("%w %q (want one of %s)", errUnknownField, field, strings.Join(sourceFields, ", "))}
		}
		if err != nil {
			return src, bad("%w", err)
		}
	}
	if tolerance != nil {
		d, err := time.ParseDuration(tolerance.Value)
		if err != nil {
			return src, &lineError{tolerance.Line, fmt.Errorf("field tolerance: %w: %q is not a duration such as 5m", webhook.ErrInvalidSource, tolerance.Value)}
		}
		src.Tolerance = d
	}
	switch {
	case len(secretEnv) > 0 && len(src.Secrets) > 0:
		return src, &lineError{item.Line, fmt.Errorf("%w: give secret_env or secrets, not both", webhook.ErrInvalidSource)}
	case len(secretEnv) == 0 && len(src.Secrets) == 0:
		return src, &lineError{item.Line, fmt.Errorf("%w: needs secret_env (preferred) or secrets", webhook.ErrInvalidSource)}
	}
	for _, name := range secretEnv {
		secret := getenv(name)
		if strings.TrimSpace(secret) == "" {
			return src, &lineError{item.Line, fmt.Errorf("field secret_env: %s: %w", name, errEmptySecretEnv)}
		}
		src.Secrets = append(src.Secrets, secret)
	}
	return src, nil
}

// decodeResume decodes a source's resume field: a non-empty list of
// {type, token} maps, each token a template webhook.ParseTokenTemplate
// accepts (a template that cannot give a valid hook token fails here, at
// load, not at the first delivery).
func decodeResume(v *yaml.Node) ([]webhook.Resume, *lineError) {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		return nil, &lineError{v.Line, fmt.Errorf("field resume: %w: want a non-empty list of {type, token}", errWebhooksMalformed)}
	}
	out := make([]webhook.Resume, 0, len(v.Content))
	for i, item := range v.Content {
		bad := func(line int, err error) *lineError {
			return &lineError{line, fmt.Errorf("field resume, item %d: %w", i, err)}
		}
		if item.Kind != yaml.MappingNode {
			return nil, bad(item.Line, fmt.Errorf("%w: want a map with type and token", errWebhooksMalformed))
		}
		var r webhook.Resume
		seen := make(map[string]bool)
		for j := 0; j+1 < len(item.Content); j += 2 {
			k, val := item.Content[j], item.Content[j+1]
			if seen[k.Value] {
				return nil, bad(k.Line, fmt.Errorf("%w: %s given twice", errWebhooksMalformed, k.Value))
			}
			seen[k.Value] = true
			s, err := scalars(val, false)
			switch {
			case k.Value != "type" && k.Value != "token":
				return nil, bad(k.Line, fmt.Errorf("%w %q (want one of %s)", errUnknownField, k.Value, strings.Join(resumeFields, ", ")))
			case err != nil:
				return nil, bad(k.Line, fmt.Errorf("%s: %w", k.Value, err))
			case k.Value == "type":
				r.Type = s[0]
			default:
				if r.Token, err = webhook.ParseTokenTemplate(s[0]); err != nil {
					return nil, bad(val.Line, err)
				}
			}
		}
		for _, f := range resumeFields {
			if !seen[f] {
				return nil, bad(item.Line, fmt.Errorf("%w: %s is required", webhook.ErrInvalidSource, f))
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// decodeAttributes decodes a source's attributes field: a map of
// attribute name to a JSON pointer into the event's payload
// (webhook.ParsePointer); a pointer that cannot parse fails here, at load.
func decodeAttributes(v *yaml.Node) (map[string]webhook.Pointer, *lineError) {
	if v.Kind != yaml.MappingNode || len(v.Content) == 0 {
		return nil, &lineError{v.Line, fmt.Errorf("field attributes: %w: want a map of attribute name to JSON pointer, such as order_id: /data/object/metadata/order_id", errWebhooksMalformed)}
	}
	out := make(map[string]webhook.Pointer, len(v.Content)/2)
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if _, dup := out[k.Value]; dup {
			return nil, &lineError{k.Line, fmt.Errorf("field attributes: %w: %s given twice", errWebhooksMalformed, k.Value)}
		}
		if val.Kind != yaml.ScalarNode {
			return nil, &lineError{val.Line, fmt.Errorf("field attributes: %s: %w: want a JSON pointer", k.Value, errWebhooksMalformed)}
		}
		p, err := webhook.ParsePointer(val.Value)
		if err != nil {
			return nil, &lineError{val.Line, fmt.Errorf("field attributes: %s: %w", k.Value, err)}
		}
		out[k.Value] = p
	}
	return out, nil
}

// scalars returns the value of a field: one scalar, or with list a scalar
// or a list of them. Error messages never quote a value, which may be a
// secret.
func scalars(v *yaml.Node, list bool) ([]string, error) {
	switch {
	case v.Kind == yaml.ScalarNode && v.Tag != "!!null" && v.Value != "":
		return []string{v.Value}, nil
	case v.Kind == yaml.ScalarNode:
		return nil, fmt.Errorf("%w: empty", errWebhooksMalformed)
	case v.Kind == yaml.SequenceNode && list && len(v.Content) > 0:
		out := make([]string, 0, len(v.Content))
		for i, e := range v.Content {
			if e.Kind != yaml.ScalarNode || e.Tag == "!!null" || e.Value == "" {
				return nil, fmt.Errorf("%w: item %d must be a non-empty string", errWebhooksMalformed, i)
			}
			out = append(out, e.Value)
		}
		return out, nil
	case list:
		return nil, fmt.Errorf("%w: want a string or a non-empty list of strings", errWebhooksMalformed)
	default:
		return nil, fmt.Errorf("%w: want a string", errWebhooksMalformed)
	}
}
