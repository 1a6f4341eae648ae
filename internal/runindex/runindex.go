// Package runindex keeps the run index: the stream JETFLOW_RUN_INDEX, one
// small entry per kept run, from which pages of runs are read newest first
// — all runs, or by status, workflow, run ID prefix and time — at a cost
// that does not grow with the number of runs kept.
//
// The index is derived data. The run record (internal/runs) is the truth;
// runs.Store writes a new run's entry just before its record, and a run's
// entry after each later write that changes its status; readers check
// every entry they list against its record:
//
//   - An entry is a message on a subject naming the run's status, workflow
//     and run ID (subject.go); a run has one, but for a moment after a
//     status change. It carries the record's expiry: none while the run
//     runs, the run's retention once it ended, so entries expire with
//     their records.
//   - A status change publishes the new entry, then removes the entry of
//     the state the run left (bounded by the new entry's sequence). A
//     crash between the two leaves a stale entry behind, which the next
//     reader that lists it sees (its record says otherwise) and repairs.
//   - Order is the stream's: newest first by the time the index recorded
//     the run's last status change (its start, its start again, its end).
//     Time ranges read each entry's own time (Entry.UpdatedAt).
//   - A missing or partial index is rebuilt from the run records (Ensure):
//     a marker records that a build completed. Workers check it at start
//     and on every sweeper pass.
package runindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Entry is what the index holds of one run: enough to list it and to tell
// whether the entry still stands for the run's record.
type Entry struct {
	V          int          `json:"v"`
	RunID      string       `json:"run_id"`
	Workflow   string       `json:"workflow"`
	Status     state.Status `json:"status"`
	Generation int          `json:"generation,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	UpdatedAt  time.Time    `json:"updated_at"`
	// Token is the run's writer token (state.Run.Token): which run of the
	// run ID the entry stands for. Entries of earlier versions have none.
	Token string `json:"token,omitempty"`
	// Seq is the entry's stream sequence (not stored): its place in the
	// index's order.
	Seq uint64 `json:"-"`
	// AttrName and AttrValue are the attribute of an attribute entry (read
	// from its subject, not stored); "" for the run's own entry.
	AttrName, AttrValue string `json:"-"`
}

// EntryOf is the entry of run.
func EntryOf(run state.Run) Entry {
	return Entry{V: state.Version, RunID: run.RunID, Workflow: run.Workflow, Status: run.Status,
		Generation: run.Generation, CreatedAt: run.CreatedAt, UpdatedAt: run.UpdatedAt, Token: run.Token}
}

// Matches reports whether e stands for run as stored: same status,
// workflow and generation. An entry that does not is stale.
func (e Entry) Matches(run state.Run) bool {
	return e.Status == run.Status && e.Workflow == run.Workflow && e.Generation == run.Generation && e.RunID == run.RunID
}

// Written reports whether e is the entry run's own writer made: it
// Matches run and carries run's token.
func (e Entry) Written(run state.Run) bool {
	return e.Matches(run) && e.Token != "" && e.Token == run.Token
}

// Index reads and writes the run index. It is safe for concurrent use
// and cheap to make.
type Index struct {
	stream natsjs.Stream
	js     natsjs.JetStream
	nc     *nats.Conn
}

// New returns the index over provisioned assets.
func New(assets *jetstream.Assets) *Index {
	return &Index{stream: assets.Index, js: assets.JS, nc: assets.JS.Conn()}
}

// Put publishes run's entry with ttl (jetstream.TTLNever or 0: none; else
// the record's expiry) and returns its sequence. Earlier entries of the
// run under other subjects stay: the caller removes them (RemoveState,
// RemoveOlder). An entry already on the same subject (a repeat call, or
// the entry a rebuild of the index wrote from the record while this
// write was retried) is replaced, so a subject holds one entry and
// counts stay right — unless it is this very entry (same run, state and
// time), which stays where it is: moving it to the top of the index would
// hide it from a walk in progress. The usual write, onto an empty subject,
// is one request; an entry already there costs a read, and a replacement
// a write more.
func (x *Index) Put(ctx context.Context, run state.Run, ttl time.Duration) (uint64, error) {
	seq, err := x.put(ctx, run, ttl, natsjs.WithExpectLastSequencePerSubject(0))
	if !jetstream.IsWrongLastSequence(err) {
		return seq, err
	}
	if e, ok, err := x.last(ctx, run); err != nil {
		return 0, err
	} else if ok && e.Written(run) && e.UpdatedAt.Equal(run.UpdatedAt) {
		return e.Seq, nil
	}
	if seq, err = x.put(ctx, run, ttl); err != nil {
		return 0, err
	}
	return seq, x.RemoveState(ctx, run.Status, run.Workflow, run.RunID, seq)
}

// SendNew sends the entry of run, which is about to be created, with ttl,
// to be stored only if the index holds no entry of its run ID at all
// (whatever status and workflow): it is the creating process's write,
// just before the record's, and an entry already there (a duplicate
// start's run, or a run another process created and may have ended) must
// not be joined by a running one. It returns without waiting for the
// answer (NewEntry.Wait, which says ErrEntryExists when an entry was
// there: the caller finds out from the record which case it is): the
// caller sends its next request (the record) at once, and the two take
// one round trip. The entry is sent first on the connection, so the
// server has it before the next request even when the caller dies before
// either answer comes.
func (x *Index) SendNew(run state.Run, ttl time.Duration) (*NewEntry, error) {
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: entrySubject(run.Status, run.Workflow, run.RunID), Data: b, Header: nats.Header{}}
	f, err := x.js.PublishMsgAsync(msg, x.putOpts(ttl, natsjs.WithExpectLastSequenceForSubject(0, runFilter(run.RunID)))...)
	if err != nil {
		return nil, fmt.Errorf("jetflow: index run %s: %w", run.RunID, err)
	}
	return &NewEntry{f: f, runID: run.RunID}, nil
}

// NewEntry is an entry SendNew sent, whose answer is awaited with Wait.
type NewEntry struct {
	f     natsjs.PubAckFuture
	runID string
}

// Wait returns the entry's sequence once the server stored it, or an error
// matching ErrEntryExists when the index holds an entry of the run ID. A repeat call returns at once with the same answer only while
// the first has not consumed it: call it once.
func (e *NewEntry) Wait(ctx context.Context) (uint64, error) {
	select {
	case ack := <-e.f.Ok():
		return ack.Sequence, nil
	case err := <-e.f.Err():
		if jetstream.IsWrongLastSequence(err) {
			return 0, fmt.Errorf("%w: %s", ErrEntryExists, e.runID)
		}
		return 0, fmt.Errorf("jetflow: index run %s: %w", e.runID, err)
	case <-ctx.Done():
		return 0, fmt.Errorf("jetflow: index run %s: %w", e.runID, ctx.Err())
	}
}

// ErrEntryExists: SendNew found an entry of the run ID in the index.
var ErrEntryExists = errors.New("jetflow: the run index holds an entry of the run ID")

// put publishes run's entry with ttl and opts, and returns its sequence.
func (x *Index) put(ctx context.Context, run state.Run, ttl time.Duration, opts ...natsjs.PublishOpt) (uint64, error) {
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: entrySubject(run.Status, run.Workflow, run.RunID), Data: b, Header: nats.Header{}}
	ack, err := x.js.PublishMsg(ctx, msg, x.putOpts(ttl, opts...)...)
	if err != nil {
		return 0, fmt.Errorf("jetflow: index run %s: %w", run.RunID, err)
	}
	return ack.Sequence, nil
}

// RemoveState removes runID's entries for status and workflow stored
// before sequence before: after a status change, the entry of the state
// the run left. It names one subject, so the server touches only the
// block that holds it.
func (x *Index) RemoveState(ctx context.Context, status state.Status, workflow, runID string, before uint64) error {
	err := x.stream.Purge(ctx, natsjs.WithPurgeSubject(entrySubject(status, workflow, runID)), natsjs.WithPurgeSequence(before))
	if err != nil {
		return fmt.Errorf("jetflow: index run %s: remove %s entry: %w", runID, status, err)
	}
	return nil
}

// RemoveOlder removes every entry of runID stored before sequence before
// (0: every entry), whatever its status and workflow: the repair of a
// stale entry, and the clean-up of a new generation. Its filter is a
// wildcard, so the server visits every block between the run's oldest
// entry and its newest: not for the path of every run.
func (x *Index) RemoveOlder(ctx context.Context, runID string, before uint64) error {
	opts := []natsjs.StreamPurgeOpt{natsjs.WithPurgeSubject(runFilter(runID))}
	if before > 0 {
		opts = append(opts, natsjs.WithPurgeSequence(before))
	}
	if err := x.stream.Purge(ctx, opts...); err != nil {
		return fmt.Errorf("jetflow: index: remove entries of run %s: %w", runID, err)
	}
	return nil
}

// putIfAbsent publishes run's entry unless its subject holds one, without
// waiting for the answer: the rebuild's write, which never replaces an
// entry a live writer made (the answer is then a wrong-last-sequence
// error).
func (x *Index) putIfAbsent(run state.Run, ttl time.Duration) (natsjs.PubAckFuture, error) {
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: entrySubject(run.Status, run.Workflow, run.RunID), Data: b, Header: nats.Header{}}
	return x.js.PublishMsgAsync(msg, x.putOpts(ttl, natsjs.WithExpectLastSequencePerSubject(0))...)
}

// RemoveEntry removes entry e, and only it: the messages of its subject
// up to its sequence. A newer entry on the same subject (a new generation
// in the same state, a run's attribute entry written since) stays.
func (x *Index) RemoveEntry(ctx context.Context, e Entry) error {
	if e.AttrName != "" {
		return x.purgeSubject(ctx, attrSubject(e.AttrName, e.AttrValue, e.Status, e.Workflow, e.RunID), e.Seq+1)
	}
	if err := x.RemoveState(ctx, e.Status, e.Workflow, e.RunID, e.Seq+1); err != nil {
		return fmt.Errorf("jetflow: remove stale entry: %w", err)
	}
	return nil
}

// Has reports whether the index holds an entry for run in its current
// state (status, workflow, generation).
func (x *Index) Has(ctx context.Context, run state.Run) (bool, error) {
	e, ok, err := x.last(ctx, run)
	return ok && e.Matches(run), err
}

// HasOwn reports whether the index holds the entry run's own writer made
// (Entry.Written): the one a process that lost the race to create run's
// record may have written for it.
func (x *Index) HasOwn(ctx context.Context, run state.Run) (bool, error) {
	e, ok, err := x.last(ctx, run)
	return ok && e.Written(run), err
}

// last reads the newest entry on the subject of run's current state.
func (x *Index) last(ctx context.Context, run state.Run) (Entry, bool, error) {
	msgs, _, err := x.direct(ctx, directRequest{LastFor: entrySubject(run.Status, run.Workflow, run.RunID)})
	if err != nil || len(msgs) == 0 {
		return Entry{}, false, err
	}
	e, err := decodeEntry(msgs[0])
	return e, err == nil, err
}

// ErrMissing: the index stream does not exist (deleted by hand, or not
// provisioned yet). Ensure makes it again.
var ErrMissing = errors.New("jetflow: run index missing")

// missing maps the errors of a deleted stream to ErrMissing.
func missing(err error) error {
	if errors.Is(err, natsjs.ErrStreamNotFound) || errors.Is(err, natsjs.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w: %w", ErrMissing, err)
	}
	return err
}
