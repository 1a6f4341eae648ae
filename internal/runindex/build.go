package runindex

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// rebuildWindow is how many entry writes a rebuild has in flight.
const rebuildWindow = 256

// Record is a run record and the expiry of its entry (as Put takes it).
type Record struct {
	Run state.Run
	TTL time.Duration
}

// Source lists every kept run record, calling yield for each; the
// rebuild's input (runs.Store.Each).
type Source func(ctx context.Context, yield func(Record) error) error

// Built reports whether a build of the index completed (its marker is
// there). A missing stream is ErrMissing.
func (x *Index) Built(ctx context.Context) (bool, error) {
	msgs, _, err := x.direct(ctx, directRequest{LastFor: builtSubject})
	if err != nil {
		return false, err
	}
	return len(msgs) > 0, nil
}

// builtAt is the stream sequence of the marker of the last completed
// build (0: none).
func (x *Index) builtAt(ctx context.Context) (uint64, error) {
	msgs, _, err := x.direct(ctx, directRequest{LastFor: builtSubject})
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	return seqOf(msgs[0])
}

// Current reads the record of a run ID as it stands now, with what is left
// of its expiry (nil: none): the rebuild checks its running entries
// against it (runs.Store).
type Current func(ctx context.Context, runID string) (*Record, error)

// Ensure makes sure the index is complete: when no build has completed
// (a new deployment, a stream deleted and provisioned again, a build cut
// short) it writes an entry for every record src lists that has none, then
// the marker, and reports true. Entries written meanwhile by runs.Store
// are never replaced. Several processes may build at once: each write is
// create-if-absent.
//
// A run's attribute entries are written with its entry, create-if-absent
// too, and a running one is checked as the run's entry is.
//
// A record src read may have changed before its entry was written (the
// live writer then wrote the new state's entry and removed the old one,
// which this build brings back). A stale terminal entry expires; a stale
// running entry would not, so each running entry written is checked
// against cur afterwards and removed when it no longer stands for the run.
func (x *Index) Ensure(ctx context.Context, src Source, cur Current) (rebuilt bool, err error) {
	built, err := x.Built(ctx)
	if err != nil || built {
		return false, err
	}
	type write struct {
		run  state.Run
		ack  natsjs.PubAckFuture
		attr string // an attribute entry's name
	}
	var pending []write
	var running []Entry // the running entries written, to check
	settle := func() error {
		for _, w := range pending {
			select {
			case ack := <-w.ack.Ok():
				if w.run.Status.Active() {
					e := EntryOf(w.run)
					e.Seq = ack.Sequence
					if w.attr != "" {
						e.AttrName, e.AttrValue = w.attr, w.run.Attributes[w.attr]
					}
					running = append(running, e)
				}
			case err := <-w.ack.Err():
				if !jetstream.IsWrongLastSequence(err) { // a live writer came first
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		pending = pending[:0]
		return nil
	}
	err = src(ctx, func(r Record) error {
		f, err := x.putIfAbsent(r.Run, r.TTL)
		if err != nil {
			return err
		}
		pending = append(pending, write{run: r.Run, ack: f})
		attrs, names, err := x.putAttributesIfAbsent(r.Run, r.TTL)
		if err != nil {
			return err
		}
		for i, f := range attrs {
			pending = append(pending, write{run: r.Run, ack: f, attr: names[i]})
		}
		if len(pending) >= rebuildWindow {
			return settle()
		}
		return nil
	})
	if err == nil {
		err = settle()
	}
	for i := 0; err == nil && i < len(running); i++ {
		err = x.dropIfStale(ctx, running[i], cur)
	}
	if err != nil {
		return false, fmt.Errorf("jetflow: rebuild run index: %w", err)
	}
	msg := &nats.Msg{Subject: builtSubject, Data: []byte(time.Now().UTC().Format(time.RFC3339)), Header: nats.Header{}}
	if _, err := x.js.PublishMsg(ctx, msg, natsjs.WithExpectStream(jetstream.IndexStream)); err != nil {
		return false, fmt.Errorf("jetflow: rebuild run index: marker: %w", err)
	}
	return true, nil
}

// dropIfStale removes entry e when the run's record, read now, is not the
// one e stands for. The record's own entries are written first
// (create-if-absent): the run moved on while src read it, and its writer's
// entry may be missing (it wrote while the index stream was gone), so
// removing e alone could leave the run out of the index.
func (x *Index) dropIfStale(ctx context.Context, e Entry, cur Current) error {
	r, err := cur(ctx, e.RunID)
	if err != nil {
		return err
	}
	if r != nil && e.Matches(r.Run) && e.StandsFor(r.Run) {
		return nil
	}
	if r != nil && (!r.Run.Status.Terminal() || r.TTL > time.Second) {
		var acks []natsjs.PubAckFuture
		if e.AttrName == "" {
			f, err := x.putIfAbsent(r.Run, r.TTL)
			if err != nil {
				return err
			}
			acks = append(acks, f)
		} else if acks, _, err = x.putAttributesIfAbsent(r.Run, r.TTL); err != nil {
			return err
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				if !jetstream.IsWrongLastSequence(err) { // written already
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return x.RemoveEntry(ctx, e)
}
