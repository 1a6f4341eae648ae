// Package eventproto checks the NATS event protocol
// (internal/eventproto) against its JSON Schemas
// (docs/schema/event-*.schema.json) with a real JSON Schema implementation,
// santhosh-tekuri/jsonschema (draft 2020-12): the schemas against the Go
// types and the decoder, and every reply real workers send, over a plain
// NATS connection, against the reply schema. It is in the checks module so
// that the validator is in no build of a program that imports jetflow.
package eventproto
