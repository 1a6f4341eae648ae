// Package sweep is the last line of defence for runs in progress: a
// sweeper finds runs that are running with nothing left that could advance
// them, and dispatches them again.
//
// # The invariant it checks
//
// A live running run always has a message that will advance it: its
// current task stays in JETFLOW_TASKS (pending, delivered or waiting for a
// retry) until the worker holding it has stored the next one, and a step
// waiting for a retry or a sleep has a timer in JETFLOW_TIMERS. Every pair
// of writes in the engine is ordered to keep this true across crashes (see
// docs/ARCHITECTURE.md). A run without either has lost its message — a task
// terminated or purged by hand, a stream restored from an old snapshot, a
// bug — and would stay running for ever.
//
// # One pass
//
//  1. Read the run records written since the previous pass (a KV watcher
//     resuming after the highest revision already read; the first pass
//     reads every record). Keep, in memory, the running runs of the
//     workflows this worker serves; forget the others.
//  2. For each kept run that is due for a check (StuckAfter after its
//     creation, then StuckAfter after every healthy check; a run held by a
//     timer, asleep or waiting for an event, twice as long after each
//     check that finds it so, up to MaxTimerBackoff), ask the streams
//     whether it has a task (JETFLOW_TASKS, its start subject and its step
//     subjects), a timer (JETFLOW_TIMERS, when that stream exists) or an
//     awaited event (the AwaitsEvent hook).
//  3. A run with none is a suspect, checked again at the next pass. A run
//     found with none on two passes in a row, whose record is still the
//     same revision and still running, is stuck: it is counted, logged and
//     its start task is published again.
//
// # Why a start task
//
// A start task replays the workflow body: committed steps return their
// stored results without running, and the first uncommitted step is run
// (when it is the run's first step, which the start task owns) or its task
// is published (absorbed when it is pending after all). So dispatching the
// start task again is idempotent: at worst one more replay. Its message ID
// is <identity>.sweep.<revision>.<epoch> (epoch = now / StuckAfter), distinct
// from the original start's (which the broker may still remember) and the
// same for every sweeper deciding about the same record in the same epoch,
// so the sweepers of several workers store one task; the stream's
// one-pending-task-per-subject limit absorbs the rest.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// TimersStream holds the timers of runs (retries after a long backoff):
// a timer of the task on jetflow.task.<rest> waits on jetflow.timer.<rest>
// and, once due and until a worker moves it into the task stream, on
// jetflow.due.<rest>. When the stream does not exist, no run has a timer.
const TimersStream = jetstream.TimersStream

// Defaults.
const (
	// DefaultInterval is how often a sweeper makes a pass.
	DefaultInterval = time.Minute
	// DefaultStuckAfter is how old a run must be, and how long it must have
	// been since it was last seen healthy, before it is checked.
	DefaultStuckAfter = 5 * time.Minute
	// AckWaits is the least StuckAfter in AckWaits.
	AckWaits = 3
	// MinInterval bounds how often a sweeper may make a pass.
	MinInterval = 10 * time.Millisecond
)

// Run is what the sweeper knows about a run it is checking: enough to name
// its subjects, not its input.
type Run struct {
	RunID      string
	Workflow   string
	Generation int
	// Revision of the run record the sweeper read.
	Revision uint64
	// Blocked: the record says blocked (its code diverged from its
	// history); it holds its recheck timer like a waiting run. BlockedBy
	// is the build whose code diverged.
	Blocked   bool
	BlockedBy string
}

// Identity is the run generation's identity (state.RunIdentity): the token
// of its start subject and the prefix of its step IDs.
func (r Run) Identity() string { return state.RunIdentity(r.RunID, r.Generation) }

// Pass reports what one pass did, for tests and logs.
type Pass struct {
	// Read is how many run records (and markers) the pass read from the
	// runs bucket: all of them on a sweeper's first pass, then only those
	// written since.
	Read int
	// Tracked is how many running runs of served workflows the sweeper
	// keeps in memory after the pass.
	Tracked int
	// Checked lists the runs whose task and timer were looked up.
	Checked []string
	// Suspected lists the runs found without a task, timer or awaited event
	// for the first time; the next pass checks them again.
	Suspected []string
	// Redispatched lists the stuck runs whose start task this pass stored.
	Redispatched []string
	// Absorbed lists stuck runs whose start task was not stored: another
	// sweeper's was (same message ID), or a start task is pending after all.
	Absorbed []string
	// Offered lists the blocked runs that another build's code blocked,
	// which the pass woke for this worker's code to try.
	Offered []string
	// Indexed lists the runs whose missing run index entry the pass wrote.
	Indexed []string
	// Expiring is how many ended run generations the pass stored the
	// expiry of: their records go their retention after their end.
	Expiring int
	// IndexRebuilt: the pass found the run index incomplete (its build
	// marker gone: the stream deleted or purged) and rebuilt it.
	IndexRebuilt bool
	// Err is the first error the pass met (it went on with the other runs).
	Err error
}

// Config configures a Sweeper. Zero durations take the defaults.
type Config struct {
	Assets *jetstream.Assets
	// Workflows are the workflows whose runs this sweeper looks after: the
	// ones its worker serves (the metric's workflow label is bounded by
	// them, and a run of a workflow nobody serves is not stuck, only
	// waiting).
	Workflows []string
	// AckWait is the task consumers' ack wait; StuckAfter is at least
	// AckWaits of it.
	AckWait time.Duration
	// Interval between passes (default 1 minute); each wait is jittered by
	// ±10% so that the sweepers of many workers spread out.
	Interval time.Duration
	// StuckAfter (default 5 minutes, or AckWaits × AckWait when that is
	// more) is how old a run must be before it is checked, and how long a
	// run found healthy is left alone before it is checked again. A stuck
	// run is dispatched again between StuckAfter and StuckAfter + 2 ×
	// Interval after its creation or its last healthy check.
	StuckAfter time.Duration
	Logger     zerolog.Logger
	// Build is the build identity of the worker's code: a blocked run that
	// another build's code blocked is woken once, so that this code may
	// take it (a rollback, a fixed deploy) without waiting for its recheck.
	Build string
	// Metrics counts stuck runs (nil: none).
	Metrics *metrics.Metrics
	// Now is the clock (default time.Now).
	Now func() time.Time

	// AwaitsEvent, when set, reports whether run is waiting for something
	// outside the streams, which makes it healthy without a task or a
	// timer. The engine leaves it nil: a run that waits for an event (or
	// sleeps) always holds a timer of its wait (internal/workflow,
	// WaitRecheck).
	AwaitsEvent func(ctx context.Context, run Run) (bool, error)
	// AfterPass, when set, is called with the report of every pass (tests).
	AfterPass func(Pass)
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.StuckAfter == 0 {
		c.StuckAfter = max(DefaultStuckAfter, AckWaits*c.AckWait)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate names the first bad field. It checks the settings only, so that
// a worker can validate its configuration before it connects.
func (c Config) Validate() error {
	switch {
	case c.AckWait <= 0:
		return fmt.Errorf("AckWait must be positive, got %s", c.AckWait)
	case c.Interval < MinInterval:
		return fmt.Errorf("SweepInterval must be at least %s (negative: no sweeper), got %s", MinInterval, c.Interval)
	case c.StuckAfter < AckWaits*c.AckWait:
		return fmt.Errorf("StuckAfter must be at least %d × AckWait (%s), got %s",
			AckWaits, AckWaits*c.AckWait, c.StuckAfter)
	}
	return nil
}

// tracked is a running run kept between passes.
type tracked struct {
	Run
	// next is when the run is due for a check.
	next time.Time
	// suspect: found without a task, timer or awaited event at its last
	// check.
	suspect bool
	// timerChecks counts the checks in a row that found the run held by a
	// timer only (timerBackoff).
	timerChecks int
	// indexed: the run index was found to list the run (or was made to).
	indexed bool
	// offered is the revision of the blocked run's record at which this
	// sweeper woke it for its own build's code (offerBlocked).
	offered uint64
}

// Sweeper finds stuck runs. Its passes run one at a time (Start's loop, or
// calls of Pass that the caller does not overlap).
type Sweeper struct {
	cfg    Config
	log    zerolog.Logger
	served map[string]bool
	store  *runs.Store

	// seen is the highest revision of the runs bucket read so far, in the
	// bucket stream created at created.
	seen    uint64
	created time.Time
	// runs are the running runs of served workflows, by run ID.
	runs map[string]*tracked
	// timers is JETFLOW_TIMERS once bound.
	timers natsjs.Stream
	// ends are the run generations read ended whose expiry is still to
	// be stored (ends.go); endsAfter is the ends cursor read at the
	// start of the pass, endsRev its revision (0: none).
	ends      []ending
	endsAfter uint64
	endsRev   uint64
	// endsPass counts what the current pass scheduled.
	endsPass endsReport
}

// New returns a sweeper; it touches NATS only in passes.
func New(cfg Config) (*Sweeper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Assets == nil {
		return nil, errors.New("sweep: Assets are required")
	}
	served := make(map[string]bool, len(cfg.Workflows))
	for _, wf := range cfg.Workflows {
		served[wf] = true
	}
	return &Sweeper{
		cfg: cfg, log: cfg.Logger.With().Str("component", "sweeper").Logger(),
		served: served, store: runs.New(cfg.Assets), runs: make(map[string]*tracked),
	}, nil
}

// Start makes passes until stop is called; stop waits for a pass in
// progress to end (its NATS requests are cancelled).
func (s *Sweeper) Start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The first pass comes within half an interval: a worker that
		// starts after an outage looks soon, and many workers started
		// together do not all look at once.
		wait := time.Duration(rand.Int64N(int64(s.cfg.Interval)/2 + 1))
		for {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pctx, cancelPass := context.WithTimeout(ctx, max(2*s.cfg.Interval, time.Minute))
			p := s.Pass(pctx)
			cancelPass()
			if p.Err != nil && ctx.Err() == nil {
				s.log.Warn().Err(p.Err).Msg("sweep pass incomplete; the next pass tries again")
			}
			if h := s.cfg.AfterPass; h != nil && ctx.Err() == nil {
				h(p)
			}
			// ±10% jitter.
			wait = s.cfg.Interval*9/10 + time.Duration(rand.Int64N(int64(s.cfg.Interval)/5+1))
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// Pass reads the run records written since the last pass, checks the runs
// that are due, and dispatches the stuck ones again.
func (s *Sweeper) Pass(ctx context.Context) Pass {
	var p Pass
	p.IndexRebuilt, p.Err = s.ensureIndex(ctx)
	var err error
	s.endsPass = endsReport{}
	p.Read, err = s.read(ctx)
	p.Err = firstErr(p.Err, err)
	if err == nil {
		s.countRunning()
		s.endsPass.add(s.scheduleEnds(ctx))
	}
	p.Expiring, p.Err = s.endsPass.scheduled, firstErr(p.Err, s.endsPass.err)
	now := s.cfg.Now()
	timers := s.bindTimers(ctx)
	for id, t := range s.runs {
		if ctx.Err() != nil {
			break
		}
		if t.Blocked && t.BlockedBy != s.cfg.Build && t.offered != t.Revision {
			if err := s.offerBlocked(ctx, t); err != nil {
				p.Err = firstErr(p.Err, err)
			} else {
				p.Offered = append(p.Offered, id)
			}
		}
		if now.Before(t.next) {
			continue
		}
		p.Checked = append(p.Checked, id)
		if !t.indexed {
			// A run whose start's writer died between its record and its
			// index entry would not be listed until it ends.
			written, err := s.store.EnsureIndexed(ctx, id)
			if err != nil {
				p.Err = firstErr(p.Err, err)
			} else {
				t.indexed = true
				if written {
					p.Indexed = append(p.Indexed, id)
				}
			}
		}
		held, err := s.busy(ctx, t.Run, timers)
		if err != nil {
			p.Err = firstErr(p.Err, err)
			continue // checked again at the next pass
		}
		switch {
		case held == heldByTimer:
			// A sleeping or waiting run holds a timer for as long as it
			// sleeps: look again later each time, so that runs asleep
			// for days cost the sweeper next to nothing.
			t.timerChecks++
			t.suspect, t.next = false, now.Add(s.timerBackoff(t.timerChecks))
		case held != heldByNothing:
			t.suspect, t.timerChecks, t.next = false, 0, now.Add(s.cfg.StuckAfter)
		case !t.suspect:
			t.suspect = true // look again at the next pass
			p.Suspected = append(p.Suspected, id)
		default:
			d, err := s.redispatch(ctx, t, now)
			if err != nil {
				p.Err = firstErr(p.Err, err)
				continue
			}
			t.suspect, t.next = false, now.Add(s.cfg.StuckAfter)
			switch d {
			case dispatchStored:
				p.Redispatched = append(p.Redispatched, id)
			case dispatchAbsorbed:
				p.Absorbed = append(p.Absorbed, id)
			}
		}
	}
	p.Tracked = len(s.runs)
	return p
}

// ensureIndex rebuilds the run index when its build marker is gone: the
// stream was purged or deleted by hand while workers ran. One direct get
// a pass when it is there.
func (s *Sweeper) ensureIndex(ctx context.Context) (bool, error) {
	rebuilt, err := s.store.EnsureIndex(ctx)
	if errors.Is(err, runindex.ErrMissing) {
		if err := s.cfg.Assets.EnsureIndexStream(ctx); err != nil {
			return false, err
		}
		rebuilt, err = s.store.EnsureIndex(ctx)
	}
	if rebuilt {
		s.log.Warn().Msg("run index was incomplete (purged or deleted): rebuilt from the run records")
	}
	return rebuilt, err
}

// MaxTimerBackoff bounds how long a run found held by a timer is left
// alone before its next check (timerBackoff).
const MaxTimerBackoff = time.Hour

// timerBackoff is how long a run found held by a timer on n checks in a
// row is left alone: StuckAfter doubled n-1 times, at most
// max(StuckAfter, MaxTimerBackoff).
func (s *Sweeper) timerBackoff(n int) time.Duration {
	d := s.cfg.StuckAfter
	for i := 1; i < n && d < MaxTimerBackoff; i++ {
		d *= 2
	}
	return min(d, max(s.cfg.StuckAfter, MaxTimerBackoff))
}

// countRunning sets the running-runs and blocked-runs gauges of every
// served workflow from the runs kept in memory (complete only after a
// successful read). A blocked run counts in both: it has not ended.
func (s *Sweeper) countRunning() {
	n := make(map[string]int, len(s.served))
	blocked := make(map[string]int, len(s.served))
	for _, t := range s.runs {
		n[t.Workflow]++
		if t.Blocked {
			blocked[t.Workflow]++
		}
	}
	for wf := range s.served {
		s.cfg.Metrics.RunsRunning(wf, n[wf])
		s.cfg.Metrics.RunsBlockedNow(wf, blocked[wf])
	}
}

func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
