package workflow

import (
	"sync"

	"github.com/jetflow/jetflow/internal/state"
)

// historyCache keeps the committed steps of recently active runs so that a
// replay does not read every earlier step back from the steps bucket. It only
// ever holds committed results, which never change, so a cached entry is
// always correct; a miss falls back to the bucket. Runs are keyed by their
// identity (run ID and creating token), not the run ID alone, so a run ID
// reused after its retention starts with an empty history.
type historyCache struct {
	mu    sync.Mutex
	limit int
	runs  map[string]map[string]*state.Step
	order []string // insertion order, for eviction
}

func newHistoryCache(limit int) *historyCache {
	return &historyCache{limit: limit, runs: make(map[string]map[string]*state.Step)}
}

// get returns the committed record of stepID, shared: records never change,
// so callers must not change it either.
func (c *historyCache) get(runKey, stepID string) (*state.Step, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.runs[runKey][stepID]
	return s, ok
}

// put keeps s, which must not change afterwards.
func (c *historyCache) put(runKey string, s *state.Step) {
	c.mu.Lock()
	defer c.mu.Unlock()
	steps, ok := c.runs[runKey]
	if !ok {
		for len(c.order) >= c.limit && len(c.order) > 0 {
			delete(c.runs, c.order[0])
			c.order = c.order[1:]
		}
		steps = make(map[string]*state.Step)
		c.runs[runKey] = steps
		c.order = append(c.order, runKey)
	}
	steps[s.StepID] = s
}

// forget drops a finished run. Its slot in order is reclaimed lazily.
func (c *historyCache) forget(runKey string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.runs, runKey)
	if len(c.order) > 2*c.limit {
		kept := c.order[:0]
		for _, id := range c.order {
			if _, ok := c.runs[id]; ok {
				kept = append(kept, id)
			}
		}
		c.order = kept
	}
}

// cancelSet remembers recently cancelled runs (by run ID and token),
// bounded: the oldest are forgotten first.
type cancelSet struct {
	mu    sync.Mutex
	limit int
	set   map[string]bool
	order []string
}

func newCancelSet(limit int) *cancelSet {
	return &cancelSet{limit: limit, set: make(map[string]bool)}
}

func (c *cancelSet) add(runID, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := runID + "/" + token
	if c.set[k] {
		return
	}
	if len(c.order) >= c.limit {
		delete(c.set, c.order[0])
		c.order = c.order[1:]
	}
	c.set[k] = true
	c.order = append(c.order, k)
}

func (c *cancelSet) has(runID, token string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set[runID+"/"+token]
}
