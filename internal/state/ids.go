package state

import (
	"errors"
	"fmt"
	"strconv"
)

// Limits on identifiers and payloads. Run IDs and names become NATS subject
// tokens and KV keys, so their alphabet is the intersection of what both
// accept, without the dot that separates tokens.
const (
	MaxRunIDLen   = 128
	MaxNameLen    = 64
	MaxInputBytes = 512 * 1024
)

// Validation errors. The public package re-exports them, so errors.Is works
// across the boundary.
var (
	ErrInvalidRunID  = errors.New("jetflow: invalid run ID")
	ErrInvalidName   = errors.New("jetflow: invalid name")
	ErrInputTooLarge = errors.New("jetflow: input too large")
)

// ValidateRunID checks that id is 1..128 characters of [A-Za-z0-9_=-].
func ValidateRunID(id string) error {
	if err := validateToken(id, MaxRunIDLen, true); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidRunID, clip(id), err)
	}
	return nil
}

// ValidateName checks a workflow or step name: 1..64 characters of
// [A-Za-z0-9_-].
func ValidateName(name string) error {
	if err := validateToken(name, MaxNameLen, false); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidName, clip(name), err)
	}
	return nil
}

func validateToken(s string, maxLen int, allowEquals bool) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > maxLen {
		return fmt.Errorf("longer than %d bytes", maxLen)
	}
	allowed := "letters, digits, '_' and '-'"
	if allowEquals {
		allowed = "letters, digits, '_', '-' and '='"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		case c == '=' && allowEquals:
		default:
			return fmt.Errorf("character %q at %d is not allowed (use %s)", c, i, allowed)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// StepID derives the ID of the occurrence-th call (counting from zero) of the
// step called name in run runID. It is a pure function, so a step gets the
// same ID on every retry and replay, a step called in a loop gets a distinct
// ID per call, and adding another step elsewhere never changes it.
func StepID(runID, name string, occurrence int) string {
	return runID + "." + name + "." + strconv.Itoa(occurrence)
}
