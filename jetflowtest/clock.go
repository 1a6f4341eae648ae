package jetflowtest

import (
	"sync"
	"time"
)

// Clock is the time the Env's workers count sleeps, event timeouts and
// retry delays by: the real time plus how far the test advanced it.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func newClock() *Clock { return &Clock{} }

// Now is the Env's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}
