package state

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"unicode"
	"unicode/utf8"
)

// Limits of a run's attributes: the business keys (an order ID, a
// customer) a start may attach to a run so that runs can be found by them.
// Each attribute is a subject of the run index, so a run's set is small.
const (
	// MaxAttributes is the most attributes a run carries.
	MaxAttributes = 8
	// MaxAttributeNameLen bounds a name: [a-z][a-z0-9_]{0,31}.
	MaxAttributeNameLen = 32
	// MaxAttributeValueLen bounds a value: 1..64 bytes of printable UTF-8.
	MaxAttributeValueLen = 64
)

// ErrInvalidAttributes: a start's attributes break a limit (too many, a
// bad name, an empty, long or unprintable value). The public package
// re-exports it.
var ErrInvalidAttributes = errors.New("jetflow: invalid attributes")

var attributeName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// ValidateAttributes checks a start's attributes: at most MaxAttributes,
// each name [a-z][a-z0-9_]{0,31}, each value 1..MaxAttributeValueLen bytes
// of printable UTF-8 (spaces allowed, no control characters). The error
// names the first offending attribute (in name order) and matches
// ErrInvalidAttributes. A nil or empty set is valid.
func ValidateAttributes(attrs map[string]string) error {
	if len(attrs) > MaxAttributes {
		return fmt.Errorf("%w: %d attributes, limit %d", ErrInvalidAttributes, len(attrs), MaxAttributes)
	}
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ValidateAttribute(name, attrs[name]); err != nil {
			return err
		}
	}
	return nil
}

// ValidateAttribute checks one attribute, as ValidateAttributes does.
func ValidateAttribute(name, value string) error {
	if err := ValidateAttributeName(name); err != nil {
		return err
	}
	switch {
	case value == "":
		return fmt.Errorf("%w: attribute %s: empty value", ErrInvalidAttributes, name)
	case len(value) > MaxAttributeValueLen:
		return fmt.Errorf("%w: attribute %s: value is %d bytes, limit %d", ErrInvalidAttributes, name, len(value), MaxAttributeValueLen)
	case !utf8.ValidString(value):
		return fmt.Errorf("%w: attribute %s: value is not UTF-8", ErrInvalidAttributes, name)
	}
	for _, r := range value {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: attribute %s: value holds the unprintable character %U", ErrInvalidAttributes, name, r)
		}
	}
	return nil
}

// ValidateAttributeName checks an attribute's name: [a-z][a-z0-9_]{0,31}.
func ValidateAttributeName(name string) error {
	if !attributeName.MatchString(name) {
		return fmt.Errorf("%w: attribute name %q: want [a-z][a-z0-9_]{0,31}", ErrInvalidAttributes, clip(name))
	}
	return nil
}

// HasAttributes reports whether attrs holds every attribute of want with
// the same value.
func HasAttributes(attrs, want map[string]string) bool {
	for name, v := range want {
		if got, ok := attrs[name]; !ok || got != v {
			return false
		}
	}
	return true
}
