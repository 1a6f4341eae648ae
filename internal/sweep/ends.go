package sweep

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The retention of a run's records. A run generation's records — its
// steps and lease, its attempt and wait records, its hook tokens — are
// kept in buckets without an age limit (jetstream.RunRecordBuckets), so
// they live as long as the run does, however long it waits. When the run
// ends, they are due to go the run's retention after its end, when its
// run record expires. The sweeper sees every run record written (its
// read), and so every end: a record written ended, and the generations a
// new one replaced (its predecessors). For each it stores an expiry
// (state.Expiry: a timer in JETFLOW_TIMERS, batched by due time), which
// the worker that takes it when due carries out (workflow.Expire).
//
// Every worker's sweeper reads every record, so that the ends are not
// scheduled once per worker, the sweepers share a cursor (EndsKey in the
// workflows bucket): the runs bucket's revision up to which the ends have
// been scheduled. A pass schedules the ends it reads past the cursor,
// then moves the cursor up to where it read (compare-and-set; a sweeper
// that loses the race has scheduled some ends twice, which removes
// nothing twice). An expiry that cannot be stored is kept and tried again
// at the next pass, and the cursor stays below it; a sweeper that dies
// meanwhile leaves the cursor there, so the next one to read past it
// schedules it.

// EndsKey is the workflows bucket's key of the ends cursor.
const EndsKey = "ends"

// endsCursor is the value at EndsKey: the revision of the runs bucket up
// to which every end read has its expiry stored, in the bucket stream
// created at Bucket (a recreated or restored bucket starts over).
type endsCursor struct {
	After  uint64    `json:"after"`
	Bucket time.Time `json:"bucket"`
}

// maxExpiryRuns bounds the runs of one expiry: the worker that takes it
// reads their run records in one batch.
const maxExpiryRuns = 256

// maxPendingEnds bounds the ends a read keeps before it stores their
// expiries: a sweeper's first pass reads every run record kept.
const maxPendingEnds = 16 * maxExpiryRuns

// ending is the expiry of one run generation, due at due, read at
// revision rev of the runs bucket.
type ending struct {
	run state.EndedRun
	due time.Time
	rev uint64
}

// endsReport is what a pass's calls of scheduleEnds did: how many run
// generations they scheduled, and the first error.
type endsReport struct {
	scheduled int
	err       error
}

func (r *endsReport) add(n int, err error) {
	r.scheduled += n
	r.err = cmp.Or(r.err, err)
}

// expiryGrain is how finely the expiries of runs whose retention is r are
// grouped by due time: a thousandth of the retention, at least a second
// (schedules count whole seconds). The records of a run go at most that
// much after the run's retention has passed.
func expiryGrain(r time.Duration) time.Duration {
	return max(time.Second, (r / 1000).Truncate(time.Second))
}

// noteEnds records the ends that e, decoded as run, stands for: a
// record's own end when it ended, and those of the generations it
// replaced. Revisions the cursor has passed are left out.
//
// Before the deployment has a cursor (its first worker of this version,
// over the buckets of the version before, whose run records expired with
// their age limit) an expiry marker stands for the end of a run whose
// records may have outlived it: the version before let a run's records
// expire the deployment's retention after their write, and a workflow's
// retention can be shorter. Its first generation's records are due at
// once.
func (s *Sweeper) noteEnds(e natsjs.KeyValueEntry, run *state.Run) {
	rev := e.Revision()
	if rev <= s.endsAfter {
		return
	}
	if run == nil {
		if s.endsRev == 0 && e.Operation() != natsjs.KeyValuePut && state.ValidateRunID(e.Key()) == nil {
			s.ends = append(s.ends, ending{state.EndedRun{RunID: e.Key()}, e.Created(), rev})
		}
		return
	}
	stored := e.Created()
	retention := s.store.Retention(*run)
	add := func(generation int, token string, ended time.Time) {
		grain := expiryGrain(retention)
		due := ended.Add(retention)
		if r := due.Truncate(grain); r.Before(due) {
			due = r.Add(grain)
		}
		s.ends = append(s.ends, ending{state.EndedRun{RunID: run.RunID, Generation: generation, Token: token}, due, rev})
	}
	if run.Status.Terminal() {
		// Its record expires the retention after this write, by the
		// server's clock.
		add(run.Generation, run.Token, stored)
	}
	for _, p := range run.Predecessors {
		ended := p.Ended
		if ended.IsZero() {
			ended = stored // an earlier version's record: ended before this one
		}
		add(p.Generation, p.Token, ended)
	}
}

// readCursor reads the ends cursor: the revision after which the ends
// have yet to be scheduled (0 when there is no cursor, or it is another
// runs bucket's, or further than the bucket has come: restored from an
// older snapshot), and its own revision (0: none).
func (s *Sweeper) readCursor(ctx context.Context, lastSeq uint64) (after, rev uint64, err error) {
	v, rev, err := s.cfg.Assets.Workflows.Get(ctx, EndsKey)
	if errors.Is(err, jetstream.ErrNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("sweep: read the ends cursor: %w", err)
	}
	var c endsCursor
	if err := json.Unmarshal(v, &c); err != nil || !c.Bucket.Equal(s.created) || c.After > lastSeq {
		return 0, rev, nil
	}
	return c.After, rev, nil
}

// scheduleEnds stores the expiries of the ends noted (and of those whose
// store failed before), grouped by due time, and moves the cursor up to
// the revision read, or to just below the first end it could not store.
// It returns how many run generations it scheduled.
func (s *Sweeper) scheduleEnds(ctx context.Context) (int, error) {
	byDue := make(map[time.Time][]ending)
	for _, e := range s.ends {
		byDue[e.due] = append(byDue[e.due], e)
	}
	var (
		failed    []ending
		firstErr  error
		scheduled int
	)
	for _, due := range slices.SortedFunc(maps.Keys(byDue), time.Time.Compare) {
		for batch := range slices.Chunk(byDue[due], maxExpiryRuns) {
			if err := s.scheduleExpiry(ctx, due, batch); err != nil {
				failed, firstErr = append(failed, batch...), cmp.Or(firstErr, err)
				continue
			}
			scheduled += len(batch)
		}
	}
	s.ends = failed
	upto := s.seen
	for _, e := range failed {
		upto = min(upto, e.rev-1)
	}
	if upto > s.endsAfter {
		firstErr = cmp.Or(firstErr, s.moveCursor(ctx, upto))
	}
	return scheduled, firstErr
}

// moveCursor moves the ends cursor to upto (compare-and-set on the
// revision read). When another sweeper moved it meanwhile, it reads
// where: that sweeper scheduled what it read.
func (s *Sweeper) moveCursor(ctx context.Context, upto uint64) error {
	b, err := json.Marshal(endsCursor{After: upto, Bucket: s.created})
	if err != nil {
		return err
	}
	var rev uint64
	if s.endsRev == 0 {
		rev, err = s.cfg.Assets.Workflows.Create(ctx, EndsKey, b)
	} else {
		rev, err = s.cfg.Assets.Workflows.Update(ctx, EndsKey, b, s.endsRev)
	}
	if errors.Is(err, jetstream.ErrExists) || errors.Is(err, jetstream.ErrRevisionMismatch) {
		s.endsAfter, s.endsRev, err = s.readCursor(ctx, math.MaxUint64)
	} else if err == nil {
		s.endsAfter, s.endsRev = upto, rev
	}
	if err != nil {
		return fmt.Errorf("sweep: move the ends cursor: %w", err)
	}
	return nil
}

// scheduleExpiry stores the expiry of batch, due at due.
func (s *Sweeper) scheduleExpiry(ctx context.Context, due time.Time, batch []ending) error {
	e := state.Expiry{V: state.Version, Due: due.UTC(), Runs: make([]state.EndedRun, len(batch))}
	for i, b := range batch {
		e.Runs[i] = b.run
	}
	data, err := state.Encode(e)
	if err != nil {
		return err
	}
	return jetstream.ScheduleExpiry(ctx, s.cfg.Assets.JS, nuid.Next(), data, due)
}
