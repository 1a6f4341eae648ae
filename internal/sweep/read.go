package sweep

import (
	"context"
	"fmt"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/state"
)

// read brings s.runs up to date with the run records written since the
// highest revision already read: one ordered consumer on the runs bucket
// per pass, from that revision on (every record on the first pass). A
// record is one message per key (the bucket keeps one revision), so the
// cost of a pass is the number of records written since the previous one,
// and the memory the number of running runs. Issue 15's index of running
// runs will replace this read.
func (s *Sweeper) read(ctx context.Context) (int, error) {
	lastSeq, err := s.checkBucket(ctx)
	if err != nil {
		return 0, err
	}
	if s.endsAfter, s.endsRev, err = s.readCursor(ctx, lastSeq); err != nil {
		return 0, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.store.WatchFrom(wctx, s.seen)
	if err != nil {
		return 0, fmt.Errorf("sweep: watch %s: %w", s.store.Name(), err)
	}
	defer func() {
		_ = w.Stop()
		// Unblock the watcher's delivery callback if it is waiting to hand
		// over an entry; the channel is closed once it has stopped.
		drain := time.NewTimer(5 * time.Second)
		defer drain.Stop()
		for {
			select {
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
			case <-drain.C:
				return
			}
		}
	}()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return n, fmt.Errorf("sweep: watch %s ended", s.store.Name())
			}
			if e == nil {
				return n, nil // caught up
			}
			n++
			s.seen = max(s.seen, e.Revision())
			run := s.decodeRun(e)
			s.apply(e, run)
			s.noteEnds(e, run)
			if len(s.ends) >= maxPendingEnds {
				s.endsPass.add(s.scheduleEnds(ctx))
			}
		}
	}
}

// checkBucket starts the reading over when the runs bucket is not the
// stream the sweeper has been reading: recreated (another creation time),
// or restored from a snapshot older than what was read (its last sequence
// below the highest revision read). Resuming after the old revision would
// skip its records.
// It returns the bucket's last revision.
func (s *Sweeper) checkBucket(ctx context.Context) (uint64, error) {
	b, err := s.store.Bucket(ctx)
	if err != nil {
		return 0, fmt.Errorf("sweep: bucket %s: %w", s.store.Name(), err)
	}
	if s.seen > 0 && (!b.Created.Equal(s.created) || b.LastSeq < s.seen) {
		s.log.Warn().Uint64("read_up_to", s.seen).Uint64("last_seq", b.LastSeq).
			Msg("the runs bucket was recreated or restored; reading every run record again")
		s.seen = 0
		clear(s.runs)
		s.ends = nil
	}
	s.created = b.Created
	return b.LastSeq, nil
}

// decodeRun is the run record e holds: nil for a marker (deleted, purged
// or expired) or a record that does not decode.
func (s *Sweeper) decodeRun(e natsjs.KeyValueEntry) *state.Run {
	if e.Operation() != natsjs.KeyValuePut {
		return nil
	}
	run, err := state.DecodeRun(e.Value())
	if err != nil {
		s.log.Debug().Err(err).Str("run_id", e.Key()).Msg("undecodable run record ignored")
		return nil
	}
	return &run
}

// apply keeps or forgets the run of one record (or marker), decoded as
// run (nil: a marker, or a record that does not decode).
func (s *Sweeper) apply(e natsjs.KeyValueEntry, run *state.Run) {
	id := e.Key()
	// A run of an earlier version's executor (no Exec) is its workers'
	// to look after: this version's wakes would not move it.
	if run == nil || !run.Status.Active() || !s.served[run.Workflow] || run.Exec != state.ExecLease {
		delete(s.runs, id)
		return
	}
	if t, ok := s.runs[id]; ok && t.Revision == e.Revision() {
		return
	}
	if t, ok := s.runs[id]; ok && t.Blocked && run.Status == state.StatusBlocked {
		// Blocked again (another replay, maybe another build's): its
		// checks go on as they were; it is offered to this worker's build
		// once per revision.
		t.Revision, t.BlockedBy = e.Revision(), blockedBy(*run)
		return
	}
	since := run.UpdatedAt
	if run.CreatedAt.After(since) {
		since = run.CreatedAt
	}
	s.runs[id] = &tracked{
		Run: Run{RunID: run.RunID, Workflow: run.Workflow, Generation: run.Generation, Revision: e.Revision(),
			Blocked: run.Status == state.StatusBlocked, BlockedBy: blockedBy(*run)},
		next: since.Add(s.cfg.StuckAfter),
	}
}

// blockedBy is the build whose code blocked run ("" for none).
func blockedBy(run state.Run) string {
	if run.Block == nil {
		return ""
	}
	return run.Block.Build
}
