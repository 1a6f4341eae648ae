// Package webhook verifies webhook deliveries and derives the run ID each
// one starts. It does no I/O: the HTTP route POST /v1/webhooks/{source}
// looks up the Source, calls Source.Verify on the raw request headers and
// body, then starts Source.Workflow under Source.RunID(event).
//
// # Schemes
//
// Standard (Standard Webhooks, also sent by Svix and others): the headers
// webhook-id, webhook-timestamp (integer unix seconds) and
// webhook-signature, a space-separated list of "v1,<base64>" entries. As in
// the reference verifiers, an entry of another version, or one that does
// not parse, is skipped: a delivery verifies when any v1 entry matches. Each
// signature is HMAC-SHA256 of "<webhook-id>.<timestamp>.<body>", the
// timestamp written as parsed (no leading zeros), as the reference
// verifiers sign it, keyed with the secret's bytes:
// the secret is "whsec_" followed by base64, and a secret without the
// prefix is read as base64 too. The event type is the body's "type" when the
// body is a JSON object that has one.
//
// GitHub: X-Hub-Signature-256 is "sha256=<hex>", HMAC-SHA256 of the body
// keyed with the secret string. The delivery ID (a GUID) is
// X-GitHub-Delivery and the event type X-GitHub-Event. Neither header is
// covered by the signature, and there is no timestamp.
//
// Stripe: Stripe-Signature is "t=<unix>,v1=<hex>[,v1=<hex>...]"; as in
// stripe-go, other schemes such as v0 and v1 values that are not hex are
// skipped, so any one hex v1 may match. Each v1 is HMAC-SHA256 of
// "<t>.<body>" (t written as parsed, as stripe-go does) keyed with the secret string as it is, whsec_ prefix included. The event
// ID and type are the body's "id" and "type": the body must be a JSON object
// with a non-empty string "id".
//
// Every comparison of signatures is constant-time. A source may have several
// secrets while one is rotated: a delivery signed with any of them verifies.
//
// # Replay
//
// For Standard and Stripe the signature covers the timestamp, and Verify
// refuses a timestamp further than Source.Tolerance (default five minutes)
// from now, in the past or in the future, so a captured delivery can be
// replayed only within that window. Within it, and for GitHub at any time,
// replay is stopped downstream: the run ID is derived from the source and
// the event ID alone (see Run IDs), so a replayed or re-delivered event
// lands on the run its first delivery started (run admission is
// create-if-absent on the run ID), for as long as the workflow's retention
// remembers that ID.
//
// For Standard the event ID is signed; for Stripe it is in the signed body.
// GitHub signs only the body: someone who captured a delivery could resend
// its body under a new X-GitHub-Delivery and start a second run with the
// same payload. Keep GitHub secrets and deliveries on TLS, and make the
// workflow's effects idempotent on the payload where that matters (a step
// idempotency key built from the payload, say).
//
// # Run IDs
//
// Source.RunID maps every event ID to a run ID, deterministically and
// without two event IDs of a source sharing one, so that a valid delivery
// is never refused for its ID (a sender retries a refused delivery until
// it disables the endpoint):
//
//   - an event ID that fits a run ID after "<source>-" (characters of
//     [A-Za-z0-9_=-], 128 in all) and does not start with "=" is kept:
//     evt_1NG8Du2eZvKYlo2C of source stripe is run stripe-evt_1NG8Du2eZvKYlo2C;
//   - any other — with a '.', ':' or '/', non-ASCII, too long, or starting
//     with "=" — becomes "<source>-=" and the unpadded base64url SHA-256 of
//     the event ID: msg.1 of source users is run
//     users-=<43 characters>.
//
// A kept ID never starts with "=" and a hashed one always does, so the two
// kinds never meet. The original event ID is kept on the run: its source
// is "webhook:<source>:<event id>" (Source.RunSource), and the HTTP reply
// carries it as event_id.
//
// # Hooks
//
// A Source may instead resume a hook for some event types (Source.Resume,
// Source.ResumeFor): the token is a TokenTemplate applied to the verified
// body, such as order-{data.object.metadata.order_id}-payment, parsed once
// (ParseTokenTemplate refuses a template that can never give a valid
// token); a body that gives none is ErrNoToken. GitHub sources cannot
// resume hooks: the event type is not signed.
//
// # Errors and secrets
//
// Errors match ErrMissingHeader, ErrMalformed, ErrBadSignature,
// ErrStaleTimestamp or ErrInvalidSource with errors.Is. No error message,
// and no formatting of a Source (fmt verbs, String, GoString, JSON), ever
// contains a secret or a signature.
package webhook
