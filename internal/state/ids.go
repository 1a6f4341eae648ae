package state

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on identifiers and payloads. Run IDs and names become NATS subject
// tokens and KV keys, so their alphabet is the intersection of what both
// accept, without the dot that separates tokens.
//
// Every record and task is one NATS message, and NATS refuses a message
// larger than the server's max_payload, 1 MiB (1,048,576 bytes) by default,
// headers included; jetflow needs at least that default. The numbers for the
// largest start (TestMaximalStartFitsInANATSMessage measures them):
//
//   - input: at most MaxInputBytes = 524,288 bytes of JSON as the caller
//     encoded it. Encode never makes an input longer (it only removes
//     insignificant whitespace and does not HTML-escape), so the input takes
//     at most that in every task and record. (With HTML-escaping, an input
//     of '<' characters grew six-fold, to 3 MiB, and failed to publish.)
//   - envelope: the other fields of a start task (run ID <= 128 bytes,
//     workflow <= 64, token, source, attributes, field names) take 3,158
//     bytes at most with a source of MaxSourceLen control characters (each
//     escaped to six bytes) and MaxAttributes attributes of the longest
//     names and values of '"' (each escaped to two bytes): a maximal start
//     task is 527,446 bytes.
//   - a step task adds the step ID (<= 213 bytes), created_at and rev: at
//     most 527,750 bytes. The run record made from the start task: 527,569,
//     and 2,272 bytes more for a generation listing MaxPredecessors
//     predecessors with the largest generation numbers. MaxStartTaskBytes
//     keeps a start task 4 KiB below MaxRecordBytes, so whatever start task
//     fits, its step tasks and run record fit too.
//   - headers: Nats-Msg-Id (the run ID) and Nats-Expected-Stream on a task,
//     Nats-Expected-Last-Subject-Sequence on a KV write: under 250 bytes;
//     MaxRecordBytes leaves 8 KiB for them.
//   - what is left: a run's final record has about 500 KiB (512,815 bytes
//     next to a maximal input, 510,526 for such a generation) for its
//     output and error.
//
// Encode refuses a record over its limit with ErrInputTooLarge, so a start
// too large for a message (a huge source, say) fails before anything is
// published or stored, and nothing is ever handed to NATS that it refuses.
const (
	MaxRunIDLen   = 128
	MaxNameLen    = 64
	MaxInputBytes = 512 * 1024

	// NATSMaxPayload is the NATS server's default max_payload.
	NATSMaxPayload = 1024 * 1024
	// MaxRecordBytes bounds any encoded record or task: NATSMaxPayload less
	// 8 KiB for message headers.
	MaxRecordBytes = NATSMaxPayload - 8*1024
	// MaxStartTaskBytes bounds an encoded start task, so that the step tasks
	// and the run record made from it fit in MaxRecordBytes.
	MaxStartTaskBytes = MaxRecordBytes - 4*1024
	// MaxSourceLen is the longest source (client name) a start should carry;
	// see ValidateSource.
	MaxSourceLen = 256
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

// MaxBuildLen bounds a build identity (ValidateBuild).
const MaxBuildLen = 64

// ErrInvalidBuild: a build identity that is empty, too long or holds a
// character other than [A-Za-z0-9._+-].
var ErrInvalidBuild = errors.New("jetflow: invalid build identity")

// ValidateBuild checks a worker's build identity: 1..MaxBuildLen
// characters of [A-Za-z0-9._+-] (a VCS revision, a version, a release
// name), so that it can be shown, compared and logged as it is.
func ValidateBuild(build string) error {
	if build == "" || len(build) > MaxBuildLen {
		return fmt.Errorf("%w %q: want 1..%d characters", ErrInvalidBuild, clip(build), MaxBuildLen)
	}
	for i := range len(build) {
		c := build[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '+' || c == '-') {
			return fmt.Errorf("%w %q: character %q not in [A-Za-z0-9._+-]", ErrInvalidBuild, clip(build), c)
		}
	}
	return nil
}

// Step names of waits for events. The step that waits for the event
// called name is named EventStepName(name) ("event=<name>") when senders
// address it by run ID and event name, HookStepName(name) ("hook=<name>")
// when they address it by a hook token. A name the body gives a step
// never holds '=', so no sender can commit a step the body runs.
const (
	eventStepPrefix = "event="
	hookStepPrefix  = "hook="
	patchStepPrefix = "patch="
)

// PatchStepName is the step name of the marker of the patch called id
// (jetflow.Patched): a step that runs no function, whose record says the
// run took the patched code's way at that point.
func PatchStepName(id string) string { return patchStepPrefix + id }

// EventStepName is the step name of a wait for the event called name,
// addressed by run ID and name.
func EventStepName(name string) string { return eventStepPrefix + name }

// HookStepName is the step name of a wait for the event called name,
// addressed by a hook token.
func HookStepName(name string) string { return hookStepPrefix + name }

// engineStepPrefixes begin the names of the steps the engine names, never
// the body: a wait for an event (EventStepName, HookStepName), a patch
// marker (PatchStepName) and a blocked run's recheck (block=divergence).
var engineStepPrefixes = []string{eventStepPrefix, hookStepPrefix, patchStepPrefix, "block="}

// validateStepName accepts a name ValidateName accepts, or a name the
// engine gives a step: one of engineStepPrefixes, then such a name.
func validateStepName(name string) error {
	for _, p := range engineStepPrefixes {
		if rest, ok := strings.CutPrefix(name, p); ok {
			return ValidateName(rest)
		}
	}
	return ValidateName(name)
}

// MaxEventIDLen bounds an event ID: a provider's (Stripe's evt_..., a
// GitHub delivery GUID, a Standard Webhooks msg_...) or the caller's.
const MaxEventIDLen = 256

// ErrInvalidEventID: an event ID that is empty, too long or holds a
// control character.
var ErrInvalidEventID = errors.New("jetflow: invalid event ID")

// ValidateEventID checks an event ID: 1..MaxEventIDLen bytes of UTF-8
// without control characters.
func ValidateEventID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidEventID)
	case len(id) > MaxEventIDLen:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidEventID, len(id), MaxEventIDLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not UTF-8", ErrInvalidEventID)
	}
	for i, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character at %d", ErrInvalidEventID, i)
		}
	}
	return nil
}

// ErrInvalidHookToken: a hook token outside the run-ID alphabet.
var ErrInvalidHookToken = errors.New("jetflow: invalid hook token")

// ValidateHookToken checks a hook token: like a run ID, 1..128 characters
// of [A-Za-z0-9_=-] (it becomes a key and a subject token).
func ValidateHookToken(token string) error {
	if err := validateToken(token, MaxRunIDLen, true); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidHookToken, clip(token), err)
	}
	return nil
}

// ValidateSource checks the source a start names (a client name for the
// audit): at most MaxSourceLen bytes, empty allowed. A longer one is
// ErrInputTooLarge.
func ValidateSource(source string) error {
	if len(source) > MaxSourceLen {
		return fmt.Errorf("%w: source is %d bytes, limit %d", ErrInputTooLarge, len(source), MaxSourceLen)
	}
	return nil
}

// validateStepID checks that stepID is what StepID(runID, name, occurrence)
// returns for a valid name and an occurrence >= 0, and returns that name.
func validateStepID(runID, stepID string) (string, error) {
	identity, rest, ok := strings.Cut(stepID, ".")
	if !ok || (identity != runID && !isLaterGeneration(runID, identity)) {
		return "", fmt.Errorf("step ID %q does not belong to run %q", clip(stepID), clip(runID))
	}
	name, occ, ok := strings.Cut(rest, ".")
	if !ok {
		return "", fmt.Errorf("step ID %q has no occurrence", clip(stepID))
	}
	if err := validateStepName(name); err != nil {
		return "", fmt.Errorf("step ID: %w", err)
	}
	n, err := strconv.Atoi(occ)
	if err != nil || n < 0 || strconv.Itoa(n) != occ {
		return "", fmt.Errorf("step ID %q: occurrence %q is not a non-negative integer", clip(stepID), clip(occ))
	}
	return name, nil
}

// StepName is the step name in a step ID (StepID): what lies between the
// run identity and the occurrence.
func StepName(stepID string) string {
	_, rest, _ := strings.Cut(stepID, ".")
	if i := strings.LastIndexByte(rest, '.'); i >= 0 {
		return rest[:i]
	}
	return rest
}

// Occurrence is the occurrence in a step ID (StepID); -1 when it has none.
func Occurrence(stepID string) int {
	i := strings.LastIndexByte(stepID, '.')
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(stepID[i+1:])
	if err != nil {
		return -1
	}
	return n
}

// isLaterGeneration reports whether identity is RunIdentity(runID, n) for
// some n >= 1.
func isLaterGeneration(runID, identity string) bool {
	gen, ok := strings.CutPrefix(identity, runID+"/")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(gen)
	return err == nil && n >= 1 && strconv.Itoa(n) == gen
}

// RunIdentity names one generation of a run: the run ID itself for the
// first, <run-id>/<n> for the n-th run started again under the same run ID
// (the conflict policy's "start new" after a run ended). Step IDs and start
// task message IDs are built from it, so a new generation never sees its
// predecessor's steps, and external APIs never see the same
// Idempotency-Key for two generations.
func RunIdentity(runID string, generation int) string {
	if generation == 0 {
		return runID
	}
	return runID + "/" + strconv.Itoa(generation)
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
// step called name in the run generation identity (RunIdentity; the run ID
// for a run's first generation). It is a pure function, so a step gets the
// same ID on every retry and replay, a step called in a loop gets a distinct
// ID per call, and adding another step elsewhere never changes it.
func StepID(identity, name string, occurrence int) string {
	return identity + "." + name + "." + strconv.Itoa(occurrence)
}

// ChildRunID derives the run ID of the child run started by the
// occurrence-th call of the step called name in the run runID, generation
// generation: <run-id>=<name>=<occurrence>, with =g<generation> appended
// for a later generation. Names and occurrences hold no '=', so the parts
// are read back from the right and two different calls never share an ID.
// An ID longer than MaxRunIDLen keeps its first 64 bytes and ends with
// =h and a hash of the whole.
func ChildRunID(runID string, generation int, name string, occurrence int) string {
	id := runID + "=" + name + "=" + strconv.Itoa(occurrence)
	if generation > 0 {
		id += "=g" + strconv.Itoa(generation)
	}
	if len(id) <= MaxRunIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return runID[:min(len(runID), 64)] + "=h" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}
