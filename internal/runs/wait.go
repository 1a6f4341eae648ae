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
// server one consumer, as waiting for one does. The watch carries keys and
// revisions only (MetaOnly): a client that waits receives a small message
// for every write to the bucket, and reads the records it waits for. The
// watch runs while anybody waits and stops one or two check periods after
// the last wait returned.
type waiters struct {
	// watch watches every record stored after revision after; lastSeq reads
	// the bucket's last revision. Tests replace them.
	watch   func(ctx context.Context, after uint64) (natsjs.KeyWatcher, error)
	lastSeq func(ctx context.Context) (uint64, error)
	// reconnects counts the client's reconnections: a watch set up before
	// one is replaced at the next check (after a server restart it was
	// seen to stay silent).
	reconnects func() uint64
	check      time.Duration

	mu    sync.Mutex
	byRun map[string]map[*waiter]struct{}
	count int
	cur   *watchStart // nil while no watch runs
	// seen are the latest writes the watch delivered, by run ID (the
	// last seenMax of them): a wait that knows its run's revision at its
	// start finds there a write it would have missed before it was
	// registered. floor is the highest revision forgotten since the watch
	// began, from the revision the watch began after (fromSet).
	seen    map[string]seenWrite
	order   []string
	floor   uint64
	from    uint64
	fromSet bool
}

// seenWrite is a write the watch delivered: its revision and outcome.
type seenWrite struct {
	rev     uint64
	outcome []byte
}

// seenMax bounds waiters.seen: at thousands of writes a second it covers
// the moment between a start and the wait for its result.
const seenMax = 4096

// watchStart is the setting up of a shared watch: ready is closed once it
// is set up, or once it failed (err, written before ready is closed).
type watchStart struct {
	ready chan struct{}
	err   error
}

// waiter is one Wait: the hub tells it the newest revision of its run ID
// it has seen stored (with the write's OutcomeHeader, when it had one), or
// that it gave up (err).
type waiter struct {
	signal  chan struct{}
	mu      sync.Mutex
	rev     uint64
	outcome []byte
	err     error // the hub gave up: the connection is closed
}

// stored tells w that its run ID's record was written at revision rev,
// with outcome (nil: none).
func (w *waiter) stored(rev uint64, outcome []byte) {
	w.mu.Lock()
	if rev > w.rev {
		w.rev, w.outcome = rev, outcome
	}
	w.mu.Unlock()
	w.wake()
}

// fail ends w's wait with err.
func (w *waiter) fail(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
	w.wake()
}

func (w *waiter) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// newest is the newest revision of the record seen stored (0: none yet),
// its write's outcome, and the hub's error if it gave up.
func (w *waiter) newest() (uint64, []byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev, w.outcome, w.err
}

// watchMeta watches the keys, revisions and headers (no values) of every
// record stored after revision after (every record when after is 0).
func (s *Store) watchMeta(ctx context.Context, after uint64) (natsjs.KeyWatcher, error) {
	return s.runs.WatchHeaders(ctx, after)
}

func newWaiters(s *Store, nc *nats.Conn) *waiters {
	return &waiters{
		watch:      s.watchMeta,
		reconnects: func() uint64 { return nc.Stats().Reconnects },
		lastSeq: func(ctx context.Context) (uint64, error) {
			b, err := s.Bucket(ctx)
			return b.LastSeq, err
		},
		check: waitCheck,
		byRun: make(map[string]map[*waiter]struct{}),
		seen:  make(map[string]seenWrite),
	}
}

// add registers a waiter for runID and returns it once the shared watch is
// set up, so that every record stored from then on reaches it. The caller
// removes it (remove) whatever happens next. A watch that cannot be set up
// is an error wrapped with jetstream.Unavailable.
//
// covered is true when since (a revision of runID's record the caller
// knows; 0 for none) is one the watch has covered since: every write of
// the record after since has reached the waiter, or will, so the caller
// need not read the record.
func (h *waiters) add(ctx context.Context, runID string, since uint64) (_ *waiter, covered bool, _ error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
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
		return nil, false, ctx.Err()
	}
	if start.err != nil {
		h.remove(runID, w)
		return nil, false, start.err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if since > 0 && h.cur == start && h.fromSet && h.from <= since && h.floor <= since {
		covered = true
		if sw, ok := h.seen[runID]; ok && sw.rev > since {
			w.stored(sw.rev, sw.outcome)
		}
	}
	return w, covered, nil
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
	h.mu.Lock()
	h.from, h.fromSet, h.floor = after, true, 0
	clear(h.seen)
	h.order = h.order[:0]
	h.mu.Unlock()
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
	h.cur, h.fromSet = nil, false
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
	h.cur, h.fromSet = nil, false
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
// merely behind is kept); or the client reconnected since.
func (h *waiters) deliver(ctx context.Context, w natsjs.KeyWatcher, after, top uint64) (uint64, bool) {
	tick := time.NewTicker(h.check)
	defer tick.Stop()
	mark := after // the bucket's last revision at the previous check
	reconnects := h.reconnects()
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
				var outcome []byte
				if he, ok := e.(jetstream.HeaderEntry); ok {
					if v := he.Header().Get(OutcomeHeader); v != "" {
						outcome = []byte(v)
					}
				}
				h.offer(e.Key(), e.Revision(), outcome)
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
			if h.reconnects() != reconnects {
				return after, false // set up before a reconnection
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

// offer tells the waiters of runID that its record was written at rev,
// with outcome (nil: none), and remembers the write (seen).
func (h *waiters) offer(runID string, rev uint64, outcome []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.seen[runID]; !ok {
		h.order = append(h.order, runID)
	}
	h.seen[runID] = seenWrite{rev: rev, outcome: outcome}
	for len(h.order) > seenMax {
		old := h.order[0]
		h.order = h.order[1:]
		h.floor = max(h.floor, h.seen[old].rev)
		delete(h.seen, old)
	}
	for w := range h.byRun[runID] {
		w.stored(rev, outcome)
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
// the first final record it reads after the one it read when it began.
// The watch carries revisions and headers only (no values): a Wait reads
// its record when the watch shows it written. When the client's connection
// is closed, every Wait returns an error wrapped with jetstream.Unavailable.
func (s *Store) Wait(ctx context.Context, runID string) (state.Run, error) {
	return s.waitUntil(ctx, runID, 0, false, func(r state.Run) bool { return r.Status.Terminal() })
}

// WaitGeneration is Wait for the generation gen of run runID: it returns
// the first record that is gen in a final state, or a later generation
// (which replaced gen: a superseding start, or a start again after gen
// ended). It reports the same errors as Wait.
//
// since, when not 0, is a revision at which the caller saw the record
// running (the start's): a wait that the shared watch covers from there
// reads nothing, and takes the run's end from the outcome the final write
// carries (OutcomeHeader: the record without its input and its other
// fields, as Handle.Result needs it), reading the record only when the
// outcome did not fit.
func (s *Store) WaitGeneration(ctx context.Context, runID string, gen int, since uint64) (state.Run, error) {
	return s.waitUntil(ctx, runID, since, true, func(r state.Run) bool { return r.Status.Terminal() || r.Generation > gen })
}

// waitUntil waits until the record of runID satisfies done; see
// WaitGeneration for since and outcomes.
func (s *Store) waitUntil(ctx context.Context, runID string, since uint64, outcomes bool, done func(state.Run) bool) (state.Run, error) {
	w, covered, err := s.waiters.add(ctx, runID, since)
	if err != nil {
		return state.Run{}, err
	}
	defer s.waiters.remove(runID, w)
	rev := since
	if !covered {
		// The watch is set up: a record stored from now on reaches w,
		// and this read sees every record stored before.
		var r state.Run
		r, rev, err = s.Get(ctx, runID)
		switch {
		case ctx.Err() != nil:
			return state.Run{}, ctx.Err() // ctx's own error, never a retryable one
		case errors.Is(err, ErrNotFound):
			return state.Run{}, err
		case err != nil:
			return state.Run{}, jetstream.Unavailable(err)
		}
		if done(r) {
			return r, nil
		}
	}
	retry := time.NewTimer(0)
	<-retry.C
	defer retry.Stop()
	backoff := readRetry
	for {
		select {
		case <-ctx.Done():
			return state.Run{}, ctx.Err()
		case <-w.signal:
		case <-retry.C: // a read that failed
		}
		newer, outcome, err := w.newest()
		if newer <= rev {
			if err != nil {
				return state.Run{}, err
			}
			continue
		}
		if outcomes && outcome != nil {
			if r, err := state.DecodeRun(outcome); err == nil && r.RunID == runID && done(r) {
				return r, nil
			}
		}
		r, now, err := s.GetExisting(ctx, runID)
		switch {
		case ctx.Err() != nil:
			return state.Run{}, ctx.Err()
		case err != nil || now < newer:
			// The revision was seen stored: read it again soon.
			retry.Reset(backoff)
			backoff = min(2*backoff, waitCheck)
			continue
		case done(r):
			return r, nil
		}
		rev, backoff = now, readRetry
	}
}

// readRetry is the first pause before Wait reads a record again after a
// failed read.
const readRetry = 50 * time.Millisecond
