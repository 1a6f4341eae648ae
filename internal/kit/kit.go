// Package kit carries what the public test kit (package jetflowtest) sets
// on a worker and users cannot: fault hooks, step stubs and a clock, in
// WorkerConfig.Kit. Being internal, the type can be named and built only
// inside this module, so a program can leave the field nil and nothing
// else.
package kit

import (
	"time"

	"github.com/jetflow/jetflow/internal/workflow"
)

// WorkerOptions are a test worker's settings beyond jetflow.WorkerConfig.
type WorkerOptions struct {
	// Hooks inject faults and step stubs at exact points.
	Hooks workflow.Hooks
	// Now is the worker's clock (nil: time.Now): what it counts sleeps,
	// timeouts and retry delays from.
	Now func() time.Time
	// Schedule stores the worker's timers (sleeps, wait timeouts, retry
	// delays) due by Now at the real time they are due (nil: Now is real
	// time).
	Schedule workflow.ScheduleFunc
}
