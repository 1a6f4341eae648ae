// Package runs is the one reader and writer of run records (the
// jetflow_runs bucket, keyed by run ID) and of their duplicate audits
// (jetflow_audit). Admission decides what to write (internal/dedupe), the
// executor and Client.Cancel what a run's end is; this package owns how a
// record is read, listed, watched and written.
//
// Two rules hold for every write, and are written here once:
//
//   - A running record never expires: it is written with
//     jetstream.TTLNever, exempt from the bucket's age limit, however long
//     the run takes.
//   - The write that ends a run (completed, failed, cancelled) carries the
//     run's retention (Retention), so the record is kept for the retention
//     after the run ended, not after it began.
//
// Every write is create-if-absent (Create) or compare-and-set on the
// revision the writer read (Replace, Update, Finish, Cancel); Update is
// the one loop that reads again and retries when another writer came
// first.
//
// Every write that changes a run's status (or starts a new generation)
// also writes the run's entry in the run index (internal/runindex): after
// the record, but for a new run's, which comes just before it (so that a
// crash between the two never hides a run that has a record); the index
// is derived data, so a failure to write it is
// reported (Store.IndexFailed) but does not fail the record's write, and
// readers of the index repair what such a failure left.
package runs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/rs/zerolog/log"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// ErrNotFound: the run ID holds no record (never written, or expired). It
// is jetstream.ErrNotFound, so either matches.
var ErrNotFound = jetstream.ErrNotFound

// Store reads and writes run records. It is safe for concurrent use and
// cheap to make.
type Store struct {
	runs  *jetstream.KV
	audit *jetstream.KV
	// steps holds the runs' leases (state.LeaseKey), which a cancel moves.
	steps     *jetstream.KV
	retention time.Duration
	now       func() time.Time
	// waiters is the watch every Wait shares.
	waiters *waiters
	index   *runindex.Index
	// IndexFailed is told of a run index write that failed after its
	// record was written (default: a warning on zerolog's global logger).
	IndexFailed func(runID string, err error)
	// beforeIndex is Assets.BeforeIndex, afterCreate Assets.AfterCreate.
	beforeIndex, afterCreate func(runID string)
}

// New returns the store over provisioned assets.
func New(assets *jetstream.Assets) *Store {
	s := &Store{runs: assets.Runs, audit: assets.Audit, steps: assets.Steps, retention: assets.Topology.Retention, now: time.Now,
		index: runindex.New(assets), IndexFailed: assets.IndexFailed, beforeIndex: assets.BeforeIndex, afterCreate: assets.AfterCreate}
	if s.IndexFailed == nil {
		s.IndexFailed = logIndexFailure
	}
	s.waiters = newWaiters(s, assets.JS.Conn())
	return s
}

// Retention is how long run's record is kept after the run ended: the
// run's own retention, else the deployment's.
func (s *Store) Retention(run state.Run) time.Duration {
	if run.Retention != 0 {
		return run.Retention
	}
	return s.retention
}

// Expired reports whether run, a record the bucket holds, is past its
// retention at now, and when it expired: the bucket removes a record once
// its TTL passes, but a removal can be undone by an unclean stop of the
// server (the record then comes back with no TTL), so the times in the
// record decide. A run that has not ended never expires.
func (s *Store) Expired(run state.Run, now time.Time) (time.Time, bool) {
	if !run.Status.Terminal() {
		return time.Time{}, false
	}
	at := run.UpdatedAt.Add(s.Retention(run))
	return at, !now.Before(at)
}

// ttl is the per-message TTL of a write of run: never while it runs, the
// retention once it ended.
func (s *Store) ttl(run state.Run) time.Duration {
	if !run.Status.Terminal() {
		return jetstream.TTLNever
	}
	return s.Retention(run)
}

// Get reads the record of runID and its revision, or an error matching
// ErrNotFound. A record that does not decode is an error matching
// state.ErrCorrupt.
func (s *Store) Get(ctx context.Context, runID string) (state.Run, uint64, error) {
	return decoded(s.runs.Get(ctx, runID))
}

// GetExisting reads a record that a compare-and-set has just reported as
// written: a miss (a lagging replica) is retried for a while, never
// reported as ErrNotFound.
func (s *Store) GetExisting(ctx context.Context, runID string) (state.Run, uint64, error) {
	return decoded(s.runs.GetExisting(ctx, runID))
}

// decoded is the run record a read returned as bytes v at revision rev.
func decoded(v []byte, rev uint64, err error) (state.Run, uint64, error) {
	if err != nil {
		return state.Run{}, 0, err
	}
	run, err := state.DecodeRun(v)
	if err != nil {
		return state.Run{}, 0, err
	}
	return run, rev, nil
}

// Latest reads the last message stored for runID, markers included: an
// expired record leaves a marker whose revision a write after expiry
// compares against, and whose time says when the record expired.
func (s *Store) Latest(ctx context.Context, runID string) (jetstream.KeyState, error) {
	return s.runs.Latest(ctx, runID)
}

// Create writes run, which is running, if its run ID holds no record; it
// returns the new revision, or an error matching jetstream.ErrExists when a
// record or a marker is there. It is not retry-safe by itself: after a lost
// answer a retry finds its own write, which the caller tells by the
// record's token.
//
// The run's index entry is sent before the record, and the record right
// after it without waiting for the entry's answer: one round trip for the
// two. The entry reaches the server first, so a process that dies between
// the two leaves an entry a reader passes over until its record is there
// (see Repair), never a running run that no listing shows: the record,
// once written, is listed. The entry is written only while the index holds
// no entry of the run ID (runindex.Index.SendNew), so an entry that lands
// late (a retry after a rebuild of a deleted index) never joins the one
// the rebuild wrote. An entry of the run ID already there (a duplicate
// start's run, or an earlier run's entry that outlived its record) makes
// the entry's write refuse; the record's write then says which case it is
// (indexLate).
func (s *Store) Create(ctx context.Context, run state.Run) (uint64, error) {
	b, err := state.Encode(run)
	if err != nil {
		return 0, err
	}
	var entered uint64
	entry, ierr := s.index.SendNew(run, s.ttl(run))
	rev, err := s.runs.CreateTTL(ctx, run.RunID, b, s.ttl(run))
	if ierr == nil {
		entered, ierr = entry.Wait(ctx)
	}
	if err == nil && s.afterCreate != nil {
		s.afterCreate(run.RunID)
	}
	switch {
	case err == nil && ierr == nil:
		ierr = s.indexAttributes(ctx, run)
	case err == nil:
		ierr = s.indexLate(ctx, run, ierr)
	case ierr == nil && errors.Is(err, jetstream.ErrExists):
		ierr = s.dropUnlessMatching(ctx, run, entered)
	case errors.Is(ierr, runindex.ErrEntryExists):
		ierr = nil // the run ID's run has its entry; this start created nothing
	}
	if ierr != nil {
		s.IndexFailed(run.RunID, ierr)
	}
	return rev, err
}

// indexAttributes writes the attribute entries of run, just created with
// its entry: nothing for a run without attributes. A worker may have
// ended the run meanwhile and written its terminal attribute entries
// before these running ones (dropIfOvertaken).
func (s *Store) indexAttributes(ctx context.Context, run state.Run) error {
	if len(run.Attributes) == 0 {
		return nil
	}
	seqs, err := s.index.PutAttributes(ctx, run, s.ttl(run))
	if err != nil {
		return err
	}
	return s.dropIfOvertaken(ctx, run, 0, seqs)
}

// dropUnlessMatching removes the entry of run written at sequence seq by
// a Create that then found its run ID taken (another start's record, or
// an expired run's marker), unless the record there is in the entry's
// state (same status, workflow and generation).
func (s *Store) dropUnlessMatching(ctx context.Context, run state.Run, seq uint64) error {
	stored, _, err := s.Get(ctx, run.RunID)
	if err == nil && stored.Status == run.Status && stored.Workflow == run.Workflow && stored.Generation == run.Generation {
		// Another start's run in the same state: most often one that
		// raced this start and won the record, and replaces this entry
		// by its own (indexLate); else readers repair it.
		return nil
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	e := runindex.EntryOf(run)
	e.Seq = seq
	return s.index.RemoveEntry(ctx, e)
}

// indexLate writes the entries of run, just created, whose entry the
// first write did not make (err: an entry of the run ID was there, or the
// write failed): the entry is written as any other, then dropped again
// if the record has moved on meanwhile (dropIfOvertaken).
func (s *Store) indexLate(ctx context.Context, run state.Run, err error) error {
	if !errors.Is(err, runindex.ErrEntryExists) {
		return err
	}
	// Most often the entry is this very run's (same token): another
	// process — a worker creating the record from the start task, or the
	// start itself — sent it and lost the record's race. One read says so.
	if has, err := s.index.HasOwn(ctx, run); err != nil {
		return err
	} else if has {
		return s.indexAttributes(ctx, run)
	}
	seq, err := s.index.Put(ctx, run, s.ttl(run))
	if err != nil {
		return err
	}
	seqs, err := s.index.PutAttributes(ctx, run, s.ttl(run))
	if err != nil {
		return err
	}
	return s.dropIfOvertaken(ctx, run, seq, seqs)
}

// putAttributes writes run's attribute entries with ttl, then removes the
// run's older ones in state left of workflow prevWorkflow (both "": in any
// state). A run without attributes writes nothing.
func (s *Store) putAttributes(ctx context.Context, run state.Run, ttl time.Duration, left state.Status, prevWorkflow string) (runindex.AttrSeqs, error) {
	if len(run.Attributes) == 0 {
		return nil, nil
	}
	seqs, err := s.index.PutAttributes(ctx, run, ttl)
	if err != nil {
		return nil, err
	}
	return seqs, s.index.RemoveAttributes(ctx, run.Attributes, left, prevWorkflow, run.RunID, seqs)
}

// Replace writes run over the record or marker at revision rev
// (compare-and-set) and returns the new revision, or an error matching
// jetstream.ErrRevisionMismatch when another write came first.
func (s *Store) Replace(ctx context.Context, run state.Run, rev uint64) (uint64, error) {
	newRev, err := s.replace(ctx, run, rev)
	if err == nil {
		s.indexRun(ctx, run, "", "")
	}
	return newRev, err
}

// replace is Replace without the index write. The write that ends a run
// carries its outcome in a header (outcomeHeader).
func (s *Store) replace(ctx context.Context, run state.Run, rev uint64) (uint64, error) {
	b, err := state.Encode(run)
	if err != nil {
		return 0, err
	}
	return s.runs.UpdateTTLHeader(ctx, run.RunID, b, rev, s.ttl(run), outcomeHeader(run))
}

// OutcomeHeader carries, on the write that ends a run, the run's end as a
// waiter needs it (run ID, workflow, status, generation, output, error:
// a run record without the rest) when that fits in maxOutcome bytes:
// waits, which watch the bucket's headers, then need no read.
const OutcomeHeader = "Jetflow-Outcome"

// maxOutcome bounds OutcomeHeader; a larger outcome is read from the
// record.
const maxOutcome = 1024

// outcomeHeader is the header of run's write: its outcome when it ended
// and the outcome fits, else none.
func outcomeHeader(run state.Run) nats.Header {
	if !run.Status.Terminal() {
		return nil
	}
	b, err := state.Encode(state.Run{V: state.Version, RunID: run.RunID, Workflow: run.Workflow, Status: run.Status,
		Generation: run.Generation, Output: run.Output, Error: run.Error, Token: run.Token})
	if err != nil || len(b) > maxOutcome || bytes.ContainsAny(b, "\r\n") {
		return nil
	}
	return nats.Header{OutcomeHeader: []string{string(b)}}
}

// indexRun writes run's index entry after its record, then removes the
// run's entries older than it: the entry of the state it left when left
// names it (a literal subject, so the server touches one block), or any
// older entry when left is "" (a new generation, whose former state and
// workflow the caller does not know). The removal is bounded by the new
// entry's sequence, so a writer that stalls between its two writes never
// removes an entry a later writer made. A failure goes to IndexFailed.
func (s *Store) indexRun(ctx context.Context, run state.Run, left state.Status, prevWorkflow string) {
	seq, err := s.index.Put(ctx, run, s.ttl(run))
	switch {
	case err != nil:
	case left != "":
		err = s.index.RemoveState(ctx, left, prevWorkflow, run.RunID, seq)
	default:
		err = s.index.RemoveOlder(ctx, run.RunID, seq)
	}
	var seqs runindex.AttrSeqs
	if err == nil {
		seqs, err = s.putAttributes(ctx, run, s.ttl(run), left, prevWorkflow)
	}
	if err == nil {
		err = s.dropIfOvertaken(ctx, run, seq, seqs)
	}
	if err != nil {
		s.IndexFailed(run.RunID, err)
	}
}

// dropIfOvertaken removes the running entry just written for run at
// sequence seq when the run's record has moved on meanwhile. An entry
// written after the record (indexLate, or the attribute entries) may
// follow a worker that ran the run to its end in between (its start task
// is stored before the record): that worker's terminal entry then comes
// first, and removes no running entry, so the late one would stay, with
// no expiry, a run counted as running for ever. A terminal entry needs no
// check: a later write of the run supersedes it by its own removal. So
// do the run's running attribute entries just written (at seqs), and the
// run's entry itself unless seq is 0.
func (s *Store) dropIfOvertaken(ctx context.Context, run state.Run, seq uint64, seqs runindex.AttrSeqs) error {
	if !run.Status.Active() {
		return nil
	}
	now, _, err := s.GetExisting(ctx, run.RunID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	e := runindex.EntryOf(run)
	if e.Matches(now) {
		return nil
	}
	if seq > 0 {
		e.Seq = seq
		if err := s.index.RemoveEntry(ctx, e); err != nil {
			return err
		}
	}
	return s.index.RemoveAttributes(ctx, run.Attributes, run.Status, run.Workflow, run.RunID, seqs.Next())
}

// Repair handles index entry e, which a reader met and found not to stand
// for run, the record of its run ID (nil run: there is no record):
//
//   - no record: e alone is removed (an entry written after e, for a new
//     run under the same ID, stays); a running entry only once
//     RepairGrace has passed since it was written, as a run's entry is
//     written just before its record (Create);
//   - the run's own entry is there: e alone is removed;
//   - it is not, and the record was written over RepairGrace ago (its
//     writer died between the record and the entry): the run's entry is
//     written, then e removed;
//   - it is not, within RepairGrace: nothing is done. The record's writer
//     is between its two writes, and removes e itself; should it have
//     failed, a later reader repairs. (So a reader never leaves a run
//     with no entry, and a run does not move to the top of the list
//     because a reader came by.)
//
// An attribute entry (e.AttrName set) is removed when the record is gone
// or has no such attribute (an earlier generation's); when it has, the
// entry is stale by status alone: once RepairGrace has passed the run's
// attribute entries are written from the record, then e removed.
func (s *Store) Repair(ctx context.Context, e runindex.Entry, run *state.Run) error {
	if run == nil && e.AttrName == "" && e.Status == state.StatusRunning && s.now().Sub(e.UpdatedAt) < RepairGrace {
		return nil // the entry of a run being created: its record comes next (Create)
	}
	if e.AttrName != "" && run != nil && e.StandsFor(*run) {
		if s.now().Sub(run.UpdatedAt) < RepairGrace {
			return nil
		}
		if _, err := s.index.PutAttributes(ctx, *run, s.repairTTL(*run)); err != nil {
			return err
		}
	}
	if run != nil && e.AttrName == "" {
		has, err := s.index.Has(ctx, *run)
		if err != nil {
			return err
		}
		if !has {
			if s.now().Sub(run.UpdatedAt) < RepairGrace {
				return nil
			}
			if _, err := s.index.Put(ctx, *run, s.repairTTL(*run)); err != nil {
				return err
			}
			if _, err := s.putAttributes(ctx, *run, s.repairTTL(*run), "", ""); err != nil {
				return err
			}
		}
	}
	return s.index.RemoveEntry(ctx, e)
}

// Reindex writes the index entry of run, as read from its record, when the
// index holds none for it in its state, and reports whether it wrote one:
// the process that wrote the record died before it wrote the entry. The
// entry of the state the run left, running, is removed after. A repeat
// call finds the entry and writes nothing.
func (s *Store) Reindex(ctx context.Context, run state.Run) (bool, error) {
	has, err := s.index.Has(ctx, run)
	if err != nil || has {
		return false, err
	}
	s.indexRun(ctx, run, state.StatusRunning, run.Workflow)
	return true, nil
}

// EnsureIndexed writes the index entry of runID's record when the index
// holds none for it in its current state and the record was written over
// RepairGrace ago: the writer of the record died before it wrote the
// entry. It reports whether it wrote one. The sweeper calls it once for
// each running run it checks, so that such a run is listed while it runs,
// not only once it ends.
func (s *Store) EnsureIndexed(ctx context.Context, runID string) (bool, error) {
	run, _, err := s.Get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if s.now().Sub(run.UpdatedAt) < RepairGrace {
		return false, nil
	}
	has, err := s.index.Has(ctx, run)
	if err != nil || has {
		return false, err
	}
	if _, err := s.index.Put(ctx, run, s.repairTTL(run)); err != nil {
		return false, err
	}
	if _, err := s.putAttributes(ctx, run, s.repairTTL(run), "", ""); err != nil {
		return false, err
	}
	return true, nil
}

// RepairGrace is how long after a run record's write its index entry may
// still be missing because its writer is about to write it.
const RepairGrace = 30 * time.Second

// repairTTL is the expiry of an entry written late for run: none while it
// runs, what is left of its record's retention once it ended (at least a
// second).
func (s *Store) repairTTL(run state.Run) time.Duration {
	if !run.Status.Terminal() {
		return jetstream.TTLNever
	}
	return max(time.Second, s.entryTTL(run))
}

// current reads the record of runID for the run index's rebuild: nil when
// there is none.
func (s *Store) current(ctx context.Context, runID string) (*runindex.Record, error) {
	run, _, err := s.Get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &runindex.Record{Run: run, TTL: s.entryTTL(run)}, nil
}

// entryTTL is what is left of run's record's expiry: none while it runs,
// the retention after its last write once it ended.
func (s *Store) entryTTL(run state.Run) time.Duration {
	if !run.Status.Terminal() {
		return jetstream.TTLNever
	}
	return s.Retention(run) - s.now().Sub(run.UpdatedAt)
}

func logIndexFailure(runID string, err error) {
	log.Warn().Str("run_id", runID).Err(err).Msg("run index entry not written; readers repair it")
}

// Change edits a run record in place and says whether to write it: false
// leaves the stored record as it is.
type Change func(run *state.Run) (write bool, err error)

// Update applies change to the record of runID and writes the result with
// compare-and-set on the revision read. When another writer came first it
// reads the record again and applies change again. It returns the record
// as it ended up and whether this call wrote it; a run ID without a record
// is an error matching ErrNotFound.
func (s *Store) Update(ctx context.Context, runID string, change Change) (state.Run, bool, error) {
	return s.update(ctx, state.Run{RunID: runID}, 0, s.Get, change)
}

// update is the compare-and-set loop: it starts from run at rev (read with
// read first when rev is 0), and reads with read after every conflict.
func (s *Store) update(ctx context.Context, run state.Run, rev uint64, read func(context.Context, string) (state.Run, uint64, error), change Change) (state.Run, bool, error) {
	run, _, written, err := s.updateRev(ctx, run, rev, read, change)
	return run, written, err
}

// updateRev is update, which also returns the revision of the record it
// wrote (0 when it wrote none).
func (s *Store) updateRev(ctx context.Context, run state.Run, rev uint64, read func(context.Context, string) (state.Run, uint64, error), change Change) (state.Run, uint64, bool, error) {
	for {
		if rev == 0 {
			var err error
			if run, rev, err = read(ctx, run.RunID); err != nil {
				return state.Run{}, 0, false, err
			}
		}
		before, workflow := run.Status, run.Workflow
		write, err := change(&run)
		if err != nil || !write {
			return run, 0, false, err
		}
		rev, err = s.replace(ctx, run, rev)
		if errors.Is(err, jetstream.ErrRevisionMismatch) {
			rev = 0
			continue
		}
		if err != nil {
			return run, 0, false, err
		}
		if run.Status != before {
			if s.beforeIndex != nil {
				s.beforeIndex(run.RunID)
			}
			s.indexRun(ctx, run, before, workflow)
		}
		return run, rev, true, nil
	}
}

// Finish records the end of run, which the caller read at revision rev (0:
// not read; Finish reads it): end sets the final state on the record, which
// is written with compare-and-set and the run's retention. When rev is
// stale (another worker finished the run, or it changed since) Finish reads
// the record and applies end again. A record already in a final state, or
// that holds another run under the same ID now (another token: a new run
// after the retention; another generation), is left as it is: written is
// false.
func (s *Store) Finish(ctx context.Context, run state.Run, rev uint64, end func(run *state.Run)) (_ state.Run, written bool, _ error) {
	token, gen := run.Token, run.Generation
	return s.update(ctx, run, rev, s.GetExisting, func(r *state.Run) (bool, error) {
		if r.Status.Terminal() || r.Token != token || r.Generation != gen {
			return false, nil
		}
		end(r)
		return true, nil
	})
}

// Block makes the running run (read at revision rev, 0: not read) blocked
// with block: its body diverged from its history, and it runs nothing
// until compatible code takes it or an operator unblocks it. A run that
// ended, or whose record holds another run under its ID now (another token
// or generation), is left as it is, and so is a run already blocked at the
// same place (not written again for each replay that finds it so). It returns the record as it ended up and whether
// this call wrote it.
func (s *Store) Block(ctx context.Context, run state.Run, rev uint64, block jetflowtype.RunBlock) (_ state.Run, written bool, _ error) {
	token, gen := run.Token, run.Generation
	return s.update(ctx, run, rev, s.GetExisting, func(r *state.Run) (bool, error) {
		if !r.Status.Active() || r.Token != token || r.Generation != gen {
			return false, nil
		}
		if r.Status == state.StatusBlocked && r.Block != nil && SameDivergence(r.Block.Divergence, block.Divergence) {
			return false, nil
		}
		r.Status, r.UpdatedAt, r.Block = state.StatusBlocked, s.now().UTC(), &block
		return true, nil
	})
}

// SetBuild records build as the build that started run (read at revision
// rev, 0: not read) when its record names none: the first holder to park
// the run records it (Run.Build). A run that ended, that holds another run
// now, or whose record names a build already, is left as it is. It returns
// the record as it ended up and its revision when this call wrote it.
func (s *Store) SetBuild(ctx context.Context, run state.Run, rev uint64, build string) (state.Run, uint64, bool, error) {
	token, gen := run.Token, run.Generation
	return s.updateRev(ctx, run, rev, s.GetExisting, func(r *state.Run) (bool, error) {
		if !r.Status.Active() || r.Token != token || r.Generation != gen || r.Build != "" {
			return false, nil
		}
		r.Build = build
		return true, nil
	})
}

// Adopt makes run (read at revision rev) a run of the lease executor
// (state.ExecLease): a run of the executor before the lease, taken over once
// no worker of that executor is live. A run that ended, that holds another
// run now, or that is adopted already, is left as it is. It returns the
// record as it ended up and its revision (read again when another writer
// came first).
func (s *Store) Adopt(ctx context.Context, run state.Run, rev uint64) (state.Run, uint64, error) {
	token, gen := run.Token, run.Generation
	out, newRev, written, err := s.updateRev(ctx, run, rev, s.GetExisting, func(r *state.Run) (bool, error) {
		if !r.Status.Active() || r.Token != token || r.Generation != gen || r.Exec == state.ExecLease {
			return false, nil
		}
		r.Exec, r.Adopted = state.ExecLease, true
		r.UpdatedAt = time.Now().UTC()
		return true, nil
	})
	if err != nil || written {
		return out, newRev, err
	}
	return s.Get(ctx, run.RunID)
}

// SameDivergence reports whether a and b are the same report: kind, place
// and steps.
func SameDivergence(a, b *jetflowtype.Divergence) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Kind == b.Kind && a.Position == b.Position && a.History.String() == b.History.String() && a.Code.String() == b.Code.String()
}

// Unblock makes the blocked run (read at revision rev, 0: not read)
// running again, with change applied to it (nil: none): a replay went past
// the place it was blocked at, or an operator unblocked it. A run that is
// not blocked, or whose record holds another run now, or that change (run
// on the blocked record before it is written running) refuses, is left as
// it is (written false). It returns the record as it ended up and, when it
// wrote it, its new revision.
func (s *Store) Unblock(ctx context.Context, run state.Run, rev uint64, change func(r *state.Run) bool) (_ state.Run, newRev uint64, written bool, _ error) {
	token, gen := run.Token, run.Generation
	return s.updateRev(ctx, run, rev, s.GetExisting, func(r *state.Run) (bool, error) {
		if r.Status != state.StatusBlocked || r.Token != token || r.Generation != gen {
			return false, nil
		}
		if change != nil && !change(r) {
			return false, nil
		}
		r.Status, r.UpdatedAt, r.Block = state.StatusRunning, s.now().UTC(), nil
		return true, nil
	})
}

// Cancel makes the running run runID cancelled, a final state no later
// write changes. It returns the record as it ended up and whether this
// call cancelled it: a run that already ended (cancelled, completed or
// failed) is returned as it is.
//
// The run's lease is moved first (revoke), then the record written: from
// the moment the cancel is stored anywhere, the run's holder can commit no
// step, and a holder that finds the lease moved by a cancel whose record
// write never came (the canceller died between the two) finishes it.
func (s *Store) Cancel(ctx context.Context, runID string) (_ state.Run, cancelled bool, _ error) {
	return s.Update(ctx, runID, func(r *state.Run) (bool, error) {
		if r.Status.Terminal() {
			return false, nil
		}
		if err := s.revoke(ctx, *r); err != nil {
			return false, err
		}
		r.Status, r.UpdatedAt = state.StatusCancelled, s.now().UTC()
		r.Error = &state.ErrorInfo{Message: "cancelled", Kind: "cancelled", Fatal: true}
		return true, nil
	})
}

// revoke writes run's lease cancelled: its holder's next commit is
// refused, and no holder takes the run again. A repeat writes it again.
func (s *Store) revoke(ctx context.Context, run state.Run) error {
	b, err := state.Encode(state.Lease{V: state.Version, State: state.LeaseCancelled, At: s.now().UTC()})
	if err != nil {
		return err
	}
	if _, err := s.steps.Put(ctx, state.LeaseKey(state.RunIdentity(run.RunID, run.Generation)), b); err != nil {
		return fmt.Errorf("jetflow: cancel run %s: %w", run.RunID, err)
	}
	return nil
}

// Supersede cancels run, read at revision rev, for a newer start of its run
// ID: its lease is revoked and the record written cancelled with cause,
// with compare-and-set on rev, so of concurrent callers that read the same
// revision one writes. written is false, and the record is not written,
// when it changed since rev (the caller reads it again and decides on what
// it holds); an error is a write that failed or got no answer.
func (s *Store) Supersede(ctx context.Context, run state.Run, rev uint64, cause *state.ErrorInfo) (_ state.Run, written bool, _ error) {
	if !run.Status.Active() {
		return run, false, nil
	}
	if err := s.revoke(ctx, run); err != nil {
		return run, false, err
	}
	before := run.Status
	run.Status, run.UpdatedAt, run.Error = state.StatusCancelled, s.now().UTC(), cause
	if _, err := s.replace(ctx, run, rev); err != nil {
		if errors.Is(err, jetstream.ErrRevisionMismatch) {
			return run, false, nil
		}
		return run, false, err
	}
	s.indexRun(ctx, run, before, run.Workflow)
	return run, true, nil
}

// Audit reads the duplicate audit of runID (empty if it has absorbed
// none).
func (s *Store) Audit(ctx context.Context, runID string) (state.Audit, error) {
	v, _, err := s.audit.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrNotFound) {
		return state.Audit{V: state.Version}, nil
	}
	if err != nil {
		return state.Audit{}, err
	}
	return state.DecodeAudit(v)
}

// RecordDuplicate adds one duplicate start to the audit of runID with
// compare-and-set, and returns the count of duplicates it holds now. It
// first tries to create the audit (a run's first duplicate writes it
// without reading it); a refused write reads the audit and tries again.
func (s *Store) RecordDuplicate(ctx context.Context, runID string, entry state.AuditEntry) (int64, error) {
	au, err := s.updateAudit(ctx, runID, func(au *state.Audit) bool { au.Add(entry); return true })
	return au.Duplicates, err
}

// RecordRerun adds the rerun entry of runID's run to runID's audit
// (state.Audit.Reruns), as RecordDuplicate adds a duplicate, unless it
// lists that run generation already: a repeat call, or one racing it,
// adds nothing.
func (s *Store) RecordRerun(ctx context.Context, runID string, entry state.RerunEntry) error {
	_, err := s.updateAudit(ctx, runID, func(au *state.Audit) bool {
		if slices.ContainsFunc(au.Reruns, func(e state.RerunEntry) bool { return e.RunID == entry.RunID && e.Generation == entry.Generation }) {
			return false
		}
		au.AddRerun(entry)
		return true
	})
	return err
}

// updateAudit applies add to the audit of runID with compare-and-set and
// returns the audit as it stands: it first tries to create the audit
// (without reading it); a refused write reads the audit and tries again.
// add reports whether it changed the audit; when it did not, nothing is
// written.
func (s *Store) updateAudit(ctx context.Context, runID string, add func(*state.Audit) bool) (state.Audit, error) {
	var (
		au  = state.Audit{V: state.Version}
		rev uint64 // of au; 0: no audit read, create one
	)
	for {
		if !add(&au) {
			return au, nil
		}
		b, err := state.Encode(au)
		if err != nil {
			return state.Audit{}, err
		}
		if rev == 0 {
			_, err = s.audit.Create(ctx, runID, b)
		} else {
			_, err = s.audit.Update(ctx, runID, b, rev)
		}
		if err == nil {
			return au, nil
		}
		if !errors.Is(err, jetstream.ErrExists) && !errors.Is(err, jetstream.ErrRevisionMismatch) {
			return state.Audit{}, err
		}
		if err := ctx.Err(); err != nil {
			return state.Audit{}, err
		}
		v, got, err := s.audit.Get(ctx, runID)
		switch {
		case errors.Is(err, jetstream.ErrNotFound):
			au, rev = state.Audit{V: state.Version}, 0 // gone since: create it again
		case err != nil:
			return state.Audit{}, err
		default:
			if au, err = state.DecodeAudit(v); err != nil {
				return state.Audit{}, err
			}
			rev = got
		}
	}
}

// WatchFrom watches every run record (and delete, purge and expiry marker)
// written after revision after — every record when after is 0 — in
// revision order; the watcher sends nil once it has caught up. It is the
// sweeper's incremental read; the caller stops the watcher.
func (s *Store) WatchFrom(ctx context.Context, after uint64) (natsjs.KeyWatcher, error) {
	var opts []natsjs.WatchOpt
	if after > 0 {
		opts = append(opts, natsjs.ResumeFromRevision(after+1))
	}
	return s.runs.Raw().WatchAll(ctx, opts...)
}

// BucketState is what tells one runs bucket from a recreated or restored
// one: when its stream was created and its last sequence (revision).
type BucketState struct {
	Created time.Time
	LastSeq uint64
}

// Bucket reads the runs bucket's BucketState.
func (s *Store) Bucket(ctx context.Context) (BucketState, error) {
	st, err := s.runs.Raw().Status(ctx)
	if err != nil {
		return BucketState{}, err
	}
	bs, ok := st.(*natsjs.KeyValueBucketStatus)
	if !ok {
		return BucketState{}, fmt.Errorf("jetflow: runs bucket status of type %T", st)
	}
	info := bs.StreamInfo()
	return BucketState{Created: info.Created, LastSeq: info.State.LastSeq}, nil
}

// Name is the runs bucket's name, for messages.
func (s *Store) Name() string { return s.runs.Bucket() }

// EnsureIndex makes sure the run index holds an entry for every kept run:
// when no build of it has completed (see runindex.Index.Ensure) it writes
// the entries from the run records. It reports whether it rebuilt.
func (s *Store) EnsureIndex(ctx context.Context) (bool, error) {
	return s.index.Ensure(ctx, s.each, s.current)
}

// Index is the run index the store writes.
func (s *Store) Index() *runindex.Index { return s.index }

// Census is what the runs that have not ended are, counted over every kept
// run record (Census).
type Census struct {
	// Legacy counts the runs admitted by the executor before the lease
	// (engine protocol 1: records without Exec), which only that version's
	// workers run.
	Legacy int
	// ByBuild counts the others by workflow and the build that started
	// them (Run.Build; "" while none is recorded).
	ByBuild map[string]map[string]int
	// Undecodable counts the records that could not be decoded.
	Undecodable int
}

// Census reads every kept run record once (one ordered consumer) and counts
// the runs that have not ended.
func (s *Store) Census(ctx context.Context) (c Census, err error) {
	c.ByBuild = map[string]map[string]int{}
	w, err := s.runs.Raw().WatchAll(ctx, natsjs.IgnoreDeletes())
	if err != nil {
		return c, fmt.Errorf("jetflow: list runs: %w", err)
	}
	defer func() {
		if serr := w.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("jetflow: list runs: %w", serr)
		}
	}()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return c, nil
			}
			run, err := state.DecodeRun(e.Value())
			switch {
			case err != nil:
				c.Undecodable++
			case run.Status.Terminal():
			case run.Exec != state.ExecLease:
				c.Legacy++
			default:
				if c.ByBuild[run.Workflow] == nil {
					c.ByBuild[run.Workflow] = map[string]int{}
				}
				c.ByBuild[run.Workflow][run.Build]++
			}
		case <-ctx.Done():
			return c, fmt.Errorf("jetflow: list runs: %w", ctx.Err())
		}
	}
}

// each calls yield with every kept run record and what is left of its
// expiry, skipping records about to expire.
func (s *Store) each(ctx context.Context, yield func(runindex.Record) error) (err error) {
	w, err := s.runs.Raw().WatchAll(ctx, natsjs.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("jetflow: list runs: %w", err)
	}
	defer func() {
		if serr := w.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("jetflow: list runs: %w", serr)
		}
	}()
	for {
		select {
		case e := <-w.Updates():
			if e == nil { // every current record has been delivered
				return nil
			}
			run, err := state.DecodeRun(e.Value())
			if err != nil {
				return fmt.Errorf("run %s: %w", e.Key(), err)
			}
			ttl := s.entryTTL(run)
			if run.Status.Terminal() && ttl <= time.Second {
				continue
			}
			if err := yield(runindex.Record{Run: run, TTL: ttl}); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("jetflow: list runs: %w", ctx.Err())
		}
	}
}
