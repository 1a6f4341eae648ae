package jetflow

import "github.com/jetflow/jetflow/internal/kit"

// The test kit (package jetflowtest) sets a worker's hooks and clock
// through internal/kit.
func init() {
	kit.ApplyWorker = func(cfg any, o kit.WorkerOptions) any {
		c := cfg.(WorkerConfig)
		c.hooks, c.now, c.schedule = o.Hooks, o.Now, o.Schedule
		return c
	}
}
