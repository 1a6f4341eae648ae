// Package entry carries, in a context, the interface through which a start
// reached jetflow, for the entry label of the starts metric. Gateways that
// forward starts (the HTTP API) set it; the root package reads it. It
// changes nothing but that label.
package entry

import "context"

// Point is an entry point, a value of the entry label.
type Point string

// Entry points. A start whose context names none counts as SDK (Start) or
// NATS (StartByName, request-reply, the durable start subject).
const (
	SDK     Point = "sdk"     // Start, from Go
	NATS    Point = "nats"    // a NATS envelope
	HTTP    Point = "http"    // producer serve's POST /v1/workflows/{name}/runs
	Webhook Point = "webhook" // producer serve's POST /v1/webhooks/{source}
)

type key struct{}

// With returns a copy of ctx that says starts made with it came in
// through p.
func With(ctx context.Context, p Point) context.Context {
	return context.WithValue(ctx, key{}, p)
}

// From returns the entry point ctx names, or "" when it names none.
func From(ctx context.Context) Point {
	p, _ := ctx.Value(key{}).(Point)
	return p
}
