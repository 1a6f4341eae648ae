package jetflowtype

import "time"

// Topology is the deployment setting of the engine's streams and buckets
// (replicas, the broker's duplicate window, retention). Every process of a
// deployment must use the same value: workers provision with it (create or
// update), clients only create what is missing. Zero fields take the
// defaults; an invalid value makes NewClient and Worker.Start fail with an
// error that names the field.
type Topology struct {
	// Replicas of every stream and bucket: 1 on a single server (the
	// default), 3 on a three-node cluster; at most 5.
	Replicas int
	// DuplicateWindow is the broker's Nats-Msg-Id window on the task and
	// start streams (default 2 minutes; at least 100ms, at most
	// Retention). It is only the first line of deduplication: admission is
	// decided by the run record.
	DuplicateWindow time.Duration
	// Retention is how long run records are kept after their run ended,
	// and step results and audits after their last write (default 30 days;
	// at least 1s); a running run's record never expires. A run ID is
	// remembered for this long (or a workflow's shorter WithRetention); a
	// start after that creates a new run.
	Retention time.Duration
	// MemoryStorage keeps everything in memory (tests and benchmarks of the
	// broker limit only): nothing survives a NATS restart.
	MemoryStorage bool
	// StartMaxAge bounds how long a durable start envelope waits in
	// JETFLOW_STARTS for a worker that serves its workflow (default 7 days;
	// otherwise at least DuplicateWindow). An envelope older than that is
	// dropped unadmitted, so one published for a workflow no worker serves
	// (a misspelt name) does not wait forever.
	StartMaxAge time.Duration
}
