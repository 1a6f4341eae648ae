package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// fileValue is one setting read from a config file.
type fileValue struct {
	value string
	path  string
	line  int
}

// readFile reads the config file at path and checks every key against fs,
// without setting anything yet.
func readFile(fs *flag.FlagSet, path string) (map[string]fileValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) { // empty file
			return nil, nil
		}
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: %w", ErrMalformed, err)}
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &FileError{Path: path, Line: next.Line, Err: fmt.Errorf("%w: want one YAML document", ErrMalformed)}
	}
	top := &doc
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = top.Content[0]
	}
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" { // only comments
		return nil, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, &FileError{Path: path, Line: top.Line, Err: fmt.Errorf("%w: want a map of flag names to values", ErrMalformed)}
	}

	values := make(map[string]fileValue, len(top.Content)/2)
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, &FileError{Path: path, Line: k.Line, Err: fmt.Errorf("%w: keys must be flag names", ErrMalformed)}
		}
		key := k.Value
		fail := func(err error) error { return &FileError{Path: path, Line: k.Line, Key: key, Err: err} }
		f := fs.Lookup(key)
		switch {
		case f == nil:
			return nil, fail(ErrUnknownKey)
		case key == FileFlag || isCommandLineOnly(f):
			return nil, fail(ErrNotAllowed)
		case v.Kind != yaml.ScalarNode:
			return nil, fail(ErrNotScalar)
		}
		if prev, dup := values[key]; dup {
			return nil, fail(fmt.Errorf("%w (first on line %d)", ErrDuplicateKey, prev.line))
		}
		value := v.Value
		if v.Tag == "!!null" { // "key:" or "key: null"
			value = ""
		}
		values[key] = fileValue{value: value, path: path, line: k.Line}
	}
	return values, nil
}
