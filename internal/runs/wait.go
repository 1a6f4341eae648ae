package runs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// waitCheck is how often the waiters' shared watch is checked while
// anybody waits: a watch is an ordered consumer on the bucket's stream, and
// one that was set up on a stream leader that was SIGKILLed can stay
// silent afterwards (seen in the operated-cluster test). A check reads the
// stream's last sequence; when a record stored at the previous check has
// still not been delivered, the watch is replaced by one that resumes after
// the last record it delivered, so nothing stored in between is missed.
// It is also how long the watch outlives its last waiter.
const waitCheck = 5 * time.Second

// waiters is the one watch of the runs bucket that every Wait of a Store
// shares, demultiplexed by run ID: waiting for ten thousand runs costs the
// server one consumer, as waiting for one does. The watch runs while
// anybody waits and stops one check period after the last wait returned.
type waiters struct {
	// watch watches every record stored after revision after; lastSeq reads
	// the bucket's last revision. Tests replace them.
	watch   func(ctx context.Context, after uint64) (natsjs.KeyWatcher, error)
	lastSeq func(ctx context.Context) (uint64, error)
	check   time.Duration

	mu    sync.Mutex
	byRun map[string]map[*waiter]struct{}
	count int
	cur   *watchStart // nil while no watch runs
}

// watchStart is the setting up of a shared watch: ready is closed once it
// is set up, or once it failed (err, written before ready is closed).
type watchStart struct {
	ready chan struct{}
	err   error
}

// waiter is one Wait: the hub offers it every final record of its run ID
// it sees, and it keeps the newest.
type waiter struct {
	signal chan struct{}
	mu     sync.Mutex
	run    state.Run
	rev    uint64
	err    error // the hub gave up: the connection is closed
}

// offer keeps run at revision rev if it is newer than what w holds.
func (w *waiter) offer(run state.Run, rev uint64) {
	w.mu.Lock()
	if rev > w.rev {
		w.run, w.rev = run, rev
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// fail ends w's wait with err.
func (w *waiter) fail(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// newest is the newest final record offered to w, and its revision (0:
// none yet).
func (w *waiter) newest() (state.Run, uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.run, w.rev, w.err
}

func newWaiters(s *Store) *waiters {
	return &waiters{
		watch: s.WatchFrom,
		lastSeq: func(ctx context.Context) (uint64, error) {
			b, err := s.Bucket(ctx)
			return b.LastSeq, err
		},
		check: waitCheck,
		byRun: make(map[string]map[*waiter]struct{}),
	}
}

// add registers a waiter for runID and returns it once the shared watch is
// set up, so that every record stored from then on reaches it. The caller
// removes it (remove) whatever happens next. A watch that cannot be set up
// is an error wrapped with jetstream.Unavailable.
func (h *waiters) add(ctx context.Context, runID string) (*waiter, error) {
	w := &waiter{signal: make(chan struct{}, 1)}
	h.mu.Lock()
	set := h.byRun[runID]
	if set == nil {
		set = make(map[*waiter]struct{})
		h.byRun[runID] = set
	}
	set[w] = struct{}{}
	h.count++
	if h.cur == nil {
		h.cur = &watchStart{ready: make(chan struct{})}
		go h.serve(h.cur)
	}
	start := h.cur
	h.mu.Unlock()
	select {
	case <-start.ready:
	case <-ctx.Done():
		h.remove(runID, w)
		return nil, ctx.Err()
	}
	if start.err != nil {
		h.remove(runID, w)
		return nil, start.err
	}
	return w, nil
}

// remove unregisters w.
func (h *waiters) remove(runID string, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if set := h.byRun[runID]; set != nil {
		if _, ok := set[w]; ok {
			delete(set, w)
			h.count--
		}
		if len(set) == 0 {
			delete(h.byRun, runID)
		}
	}
}

// serve sets up the shared watch (closing start.ready), delivers final
// records to their waiters, and replaces the watch with one that resumes
// after the last record delivered when it closes or falls silent. It
// returns once nobody has waited for a check period; then the next add
// starts a new watch.
func (h *waiters) serve(start *watchStart) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	after, err := h.lastSeq(ctx)
	var w natsjs.KeyWatcher
	if err == nil {
		w, err = h.watch(ctx, after)
	}
	if err != nil {
		start.err = jetstream.Unavailable(fmt.Errorf("jetflow: watch runs: %w", err))
		h.mu.Lock()
		h.cur = nil
		h.mu.Unlock()
		close(start.ready)
		return
	}
	close(start.ready)
	top := after
	for {
		var done bool
		after, done = h.deliver(ctx, w, after, top)
		stopWatch(w)
		if done {
			return
		}
		// A replacement that cannot be set up is tried again every check
		// period; the waiters wait on (their contexts bound them).
		for {
			if top, err = h.lastSeq(ctx); err == nil {
				if w, err = h.watch(ctx, after); err == nil {
					break
				}
			}
			if h.stopIfIdle() {
				return
			}
			if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, natsjs.ErrConnectionClosed) {
				h.failAll(jetstream.Unavailable(fmt.Errorf("jetflow: watch runs: %w", err)))
				return
			}
			t := time.NewTimer(h.check)
			<-t.C
		}
	}
}

// stopWatch stops w and drains its updates until they close: a callback
// blocked on a full channel would otherwise hold its subscription forever.
func stopWatch(w natsjs.KeyWatcher) {
	_ = w.Stop()
	go func() {
		t := time.NewTimer(time.Minute)
		defer t.Stop()
		for {
			select {
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
			case <-t.C:
				return
			}
		}
	}()
}

// failAll resets the hub and ends every wait with err.
func (h *waiters) failAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur = nil
	for _, set := range h.byRun {
		for w := range set {
			w.fail(err)
		}
	}
}

// stopIfIdle resets the hub and reports true when nobody waits.
func (h *waiters) stopIfIdle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.count > 0 {
		return false
	}
	h.cur = nil
	return true
}

// deliver hands the records w sends to their waiters. after is the last
// revision delivered before w, top the bucket's last revision when w was
// set up: once w has caught up, everything up to top was delivered or is
// gone. It returns the last revision delivered, and done once nobody has
// waited for a whole check period (the hub is reset by then, see
// stopIfIdle). It returns with done false when w closed, or fell silent: a
// check found that a record stored by the previous check was not
// delivered, and nothing at all was delivered since (a watch that is
// merely behind is kept).
func (h *waiters) deliver(ctx context.Context, w natsjs.KeyWatcher, after, top uint64) (uint64, bool) {
	tick := time.NewTicker(h.check)
	defer tick.Stop()
	mark := after // the bucket's last revision at the previous check
	idle := false
	got := false // anything delivered since the previous check
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return after, false
			}
			got = true
			if e == nil { // caught up
				after = max(after, top)
				continue
			}
			after = max(after, e.Revision())
			if e.Operation() == natsjs.KeyValuePut {
				h.offer(e.Key(), e.Value(), e.Revision())
			}
		case <-tick.C:
			if idle && h.stopIfIdle() {
				return after, true
			}
			h.mu.Lock()
			idle = h.count == 0
			h.mu.Unlock()
			if after < mark && !got {
				return after, false // silent, not merely behind
			}
			got = false
			last, err := h.lastSeq(ctx)
			if err != nil {
				continue // the watch may well be fine; the next check asks again
			}
			mark = last
		}
	}
}

// offer decodes a record of runID stored at rev and hands it to the run's
// waiters if it is final; a record nobody waits for is not decoded.
func (h *waiters) offer(runID string, v []byte, rev uint64) {
	h.mu.Lock()
	n := len(h.byRun[runID])
	h.mu.Unlock()
	if n == 0 {
		return
	}
	run, err := state.DecodeRun(v)
	if err != nil || !run.Status.Terminal() {
		return // an undecodable record is the readers' error, reported by their Get
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.byRun[runID] {
		w.offer(run, rev)
	}
}

// Wait waits until the run runID is in a final state and returns it. It
// returns an error matching ErrNotFound if the run has no record when the
// wait begins, and ctx's error, as it is, if ctx ends while it waits; a
// NATS error is wrapped with jetstream.Unavailable when it is transient.
//
// Every Wait of a Store shares one watch of the bucket (one consumer on
// the server, however many wait). A run started again under the same ID
// while it is awaited is waited for in its new generation: Wait returns
// a final record stored after the one it read when it began (the newest
// the watch has delivered when it wakes up). When the client's connection
// is closed, every Wait returns an error wrapped with
// jetstream.Unavailable.
func (s *Store) Wait(ctx context.Context, runID string) (state.Run, error) {
	w, err := s.waiters.add(ctx, runID)
	if err != nil {
		return state.Run{}, err
	}
	defer s.waiters.remove(runID, w)
	// The watch is set up: a record stored from now on reaches w, and this
	// read sees every record stored before.
	r, rev, err := s.Get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return state.Run{}, err
	}
	if err != nil {
		return state.Run{}, jetstream.Unavailable(err)
	}
	if r.Status.Terminal() {
		return r, nil
	}
	for {
		select {
		case <-ctx.Done():
			return state.Run{}, ctx.Err()
		case <-w.signal:
			r, newer, err := w.newest()
			if newer > rev {
				return r, nil
			}
			if err != nil {
				return state.Run{}, err
			}
		}
	}
}
