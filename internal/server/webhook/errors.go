package webhook

import "errors"

// Errors returned by Validate, Verify and RunID, wrapped with detail; match
// them with errors.Is. No message ever includes a secret or a signature.
var (
	// ErrMissingHeader: a header the scheme requires is absent or empty.
	ErrMissingHeader = errors.New("webhook: missing header")
	// ErrMalformed: a header or the body does not parse, a header is
	// repeated, or the event ID is missing (any other event ID has a run
	// ID: see Source.RunID).
	ErrMalformed = errors.New("webhook: malformed delivery")
	// ErrBadSignature: no signature in the delivery matches any of the
	// source's secrets.
	ErrBadSignature = errors.New("webhook: bad signature")
	// ErrStaleTimestamp: the signed timestamp is further from now than the
	// source's tolerance, in the past or in the future.
	ErrStaleTimestamp = errors.New("webhook: timestamp outside tolerance")
	// ErrInvalidSource: a Source has a bad field; the message names it.
	ErrInvalidSource = errors.New("webhook: invalid source")
)
