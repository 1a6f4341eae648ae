package jetstream

import "time"

// DefaultStartMaxAge is the default Topology.StartMaxAge: a week, long
// enough for envelopes published while a workflow's workers are down over a
// weekend or a long rollout to be admitted when they come back, short enough
// that envelopes no worker will ever admit (a misspelt workflow name) do not
// pile up. It is a stream MaxAge rather than a per-message TTL because the
// publishers are any NATS client: the bound must not depend on them setting
// a header.
const DefaultStartMaxAge = 7 * 24 * time.Hour

// startMaxAge is t.StartMaxAge with its default.
func startMaxAge(t Topology) time.Duration {
	if t.StartMaxAge <= 0 {
		return DefaultStartMaxAge
	}
	return t.StartMaxAge
}
