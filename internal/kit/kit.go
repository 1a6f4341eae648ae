// Package kit carries what the public test kit (package jetflowtest) sets
// on a worker and users cannot: fault hooks, step stubs and a clock. It
// holds no logic; package jetflow registers ApplyWorker when it is
// initialised, so the kit can reach a WorkerConfig's unexported fields
// without widening the public API.
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

// ApplyWorker returns cfg, a jetflow.WorkerConfig, with o applied. Package
// jetflow sets it.
var ApplyWorker func(cfg any, o WorkerOptions) any

// Definition returns the engine's definition of wf, a jetflow.Registrable
// (the replay check runs its body). Package jetflow sets it.
var Definition func(wf any) workflow.Definition
