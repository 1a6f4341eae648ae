package jetflow

import (
	"github.com/jetflow/jetflow/internal/kit"
	"github.com/jetflow/jetflow/internal/workflow"
)

// The test kit (package jetflowtest) sets a worker's hooks and clock
// through internal/kit, and reads a workflow's definition for its replay
// check.
func init() {
	kit.ApplyWorker = func(cfg any, o kit.WorkerOptions) any {
		c := cfg.(WorkerConfig)
		c.hooks, c.now, c.schedule = o.Hooks, o.Now, o.Schedule
		return c
	}
	kit.Definition = func(wf any) workflow.Definition { return wf.(Registrable).definition() }
}
