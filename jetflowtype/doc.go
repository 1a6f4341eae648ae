// Package jetflowtype holds the types that jetflow's public API and its
// engine share: the deployment's Topology, a step's RetryPolicy and
// StepDetails, the ConflictPolicy of duplicate starts and its enums
// (WhileRunning, AfterEnded, FingerprintMode), a task key's KeyScope, a
// run's RunStatus, and the typed errors (StepError, CodedError,
// ConflictError, RejectedError) with the sentinels they match.
//
// Each is defined here once. The root package github.com/jetflow/jetflow
// re-exports every one of them under the same name (type aliases and
// constant and variable declarations), and the engine packages under
// internal/ use them as they are, so that no type exists twice and no value
// is converted between two vocabularies. Programs use the root package's
// names; this package is what they stand for. Validation (an unknown enum
// value is an error, never a default) is the engine's, where the values
// are used.
//
// It is a leaf: it imports the standard library only, never a package of
// the module, so that every package of the module can import it.
package jetflowtype
