// Package opcluster runs jetflow the way an operator does, as separate
// processes: three nats-server processes on the shipped cluster
// configuration (deploy/nats), worker processes and a `producer serve`
// process, and measures what a node loss, a rolling restart of NATS and a
// rolling deploy of workers cost: starts, runs, committed steps, side
// effects, lost and doubled work, and the time to recover.
//
// The package is the orchestration (building the binaries, rendering the
// shipped configs onto free local ports, starting and signalling
// processes, asking the servers which node leads a stream, loading the
// HTTP API and reading every run back); its test is the scenario
// (docs/operations.md, "What a node loss costs").
package opcluster
