package metrics

import (
	"context"
	"sync"
	"time"
)

// DefaultBacklogInterval is the sampling interval WatchBacklog uses when
// given a non-positive one.
const DefaultBacklogInterval = 15 * time.Second

// Backlog is one consumer's backlog as read from its consumer info.
type Backlog struct {
	Consumer   string // durable consumer name (bounded: one per workflow stream)
	Pending    uint64 // messages not yet delivered (NumPending)
	AckPending uint64 // delivered, not yet acked (NumAckPending)
}

// backlogState remembers which consumers the last sample reported, so a
// consumer that disappears has its series removed.
type backlogState struct {
	mu        sync.Mutex
	consumers map[string]struct{}
}

// WatchBacklog starts a goroutine that samples consumer backlogs and
// returns at once. The goroutine calls sample immediately and then every
// interval (DefaultBacklogInterval when interval <= 0), one call at a time,
// each with a context that ends after interval, until ctx is done; then it
// exits. Each successful sample replaces the backlog gauges (consumers it
// no longer lists are removed); a failed one increments
// jetflow_consumer_sample_errors_total and leaves the gauges as they were.
// A nil *Metrics or a nil sample starts nothing. Each call starts its own
// goroutine, so call it once per process.
func (m *Metrics) WatchBacklog(ctx context.Context, interval time.Duration, sample func(context.Context) ([]Backlog, error)) {
	if m == nil || sample == nil {
		return
	}
	if interval <= 0 {
		interval = DefaultBacklogInterval
	}
	go func() {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for ctx.Err() == nil {
			sctx, cancel := context.WithTimeout(ctx, interval)
			// The error is counted in the sample error metric.
			_ = m.SampleBacklog(sctx, sample)
			cancel()
			select {
			case <-ctx.Done():
			case <-ticker.C:
			}
		}
	}()
}

// SampleBacklog calls sample once and records its result as WatchBacklog
// does: on success the backlog gauges are replaced by what sample returned;
// on error the error counter is incremented and the error returned. A nil
// *Metrics returns nil without calling sample.
func (m *Metrics) SampleBacklog(ctx context.Context, sample func(context.Context) ([]Backlog, error)) error {
	if m == nil || sample == nil {
		return nil
	}
	backlogs, err := sample(ctx)
	if err != nil {
		m.sampleErrors.Inc()
		return err
	}
	m.setBacklogs(backlogs)
	return nil
}

// setBacklogs sets the gauges of every consumer in backlogs and deletes the
// series of consumers the previous sample had and this one lacks. It never
// resets the vectors, so a concurrent scrape sees either value, never a gap.
func (m *Metrics) setBacklogs(backlogs []Backlog) {
	m.backlog.mu.Lock()
	defer m.backlog.mu.Unlock()
	seen := make(map[string]struct{}, len(backlogs))
	for _, b := range backlogs {
		seen[b.Consumer] = struct{}{}
		m.pending.WithLabelValues(b.Consumer).Set(float64(b.Pending))
		m.ackPending.WithLabelValues(b.Consumer).Set(float64(b.AckPending))
	}
	for c := range m.backlog.consumers {
		if _, ok := seen[c]; !ok {
			m.pending.DeleteLabelValues(c)
			m.ackPending.DeleteLabelValues(c)
		}
	}
	m.backlog.consumers = seen
}
