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

// Ensure makes sure the index is complete: when no build has completed
// (a new deployment, a stream deleted and provisioned again, a build cut
// short) it writes an entry for every record src lists that has none, then
// the marker, and reports true. Entries written meanwhile by runs.Store
// are never replaced. Several processes may build at once: each write is
// create-if-absent.
func (x *Index) Ensure(ctx context.Context, src Source) (rebuilt bool, err error) {
	built, err := x.Built(ctx)
	if err != nil || built {
		return false, err
	}
	var pending []natsjs.PubAckFuture
	settle := func() error {
		for _, f := range pending {
			select {
			case <-f.Ok():
			case err := <-f.Err():
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
		if pending = append(pending, f); len(pending) == rebuildWindow {
			return settle()
		}
		return nil
	})
	if err == nil {
		err = settle()
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
