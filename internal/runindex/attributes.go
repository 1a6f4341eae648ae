package runindex

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Attribute entries. A run started with attributes (state.Run.Attributes)
// has, besides its entry, one entry per attribute on
//
//	jetflow.runindex.a.<name>.<value in hex>.<run ID>
//
// so that the runs with an attribute's value are a subject filter
// (…<name>.<value in hex>.*) the server answers from its subject index:
// a page by attribute walks those entries only. The value is hex-encoded
// because a value may hold any printable character (dots and spaces
// included), which a subject token may not; equality is all a query asks,
// so the value is one token. An attribute entry holds the same Entry as
// the run's own entry and is written after it at every status change,
// with the same expiry, so it orders and expires like it. A run without
// attributes writes none.
const attrPrefix = subjectPrefix + "a."

// attrSubject is the subject of runID's entry for attribute name=value.
func attrSubject(name, value, runID string) string {
	return attrPrefix + name + "." + hex.EncodeToString([]byte(value)) + "." + runID
}

// attrFilter matches the entries of every run with attribute name=value.
func attrFilter(name, value string) string {
	return attrPrefix + name + "." + hex.EncodeToString([]byte(value)) + ".*"
}

// parseAttrSubject reads the attribute of an attribute entry's subject; ok
// is false for any other subject.
func parseAttrSubject(subject string) (name, value string, ok bool) {
	rest, found := strings.CutPrefix(subject, attrPrefix)
	if !found {
		return "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", "", false
	}
	v, err := hex.DecodeString(parts[1])
	if err != nil {
		return "", "", false
	}
	return parts[0], string(v), true
}

// PutAttributes writes run's entry under each of its attributes with ttl
// (as Put takes it), all in flight at once. With replace, it then removes
// each attribute's older entries of the run (bounded by the new entry's
// sequence, so an entry a later writer made stays): the write of a status
// change. A run without attributes writes nothing.
func (x *Index) PutAttributes(ctx context.Context, run state.Run, ttl time.Duration, replace bool) error {
	if len(run.Attributes) == 0 {
		return nil
	}
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return err
	}
	names := slices.Sorted(maps.Keys(run.Attributes))
	acks := make([]natsjs.PubAckFuture, len(names))
	for i, name := range names {
		msg := &nats.Msg{Subject: attrSubject(name, run.Attributes[name], run.RunID), Data: b, Header: nats.Header{}}
		if acks[i], err = x.js.PublishMsgAsync(msg, x.putOpts(ttl)...); err != nil {
			return fmt.Errorf("jetflow: index run %s: attribute %s: %w", run.RunID, name, err)
		}
	}
	seqs := make([]uint64, len(names))
	for i, f := range acks {
		select {
		case ack := <-f.Ok():
			seqs[i] = ack.Sequence
		case err := <-f.Err():
			return fmt.Errorf("jetflow: index run %s: attribute %s: %w", run.RunID, names[i], err)
		case <-ctx.Done():
			return fmt.Errorf("jetflow: index run %s: attributes: %w", run.RunID, ctx.Err())
		}
	}
	if !replace {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, name := range names {
		g.Go(func() error {
			return x.purgeSubject(gctx, attrSubject(name, run.Attributes[name], run.RunID), seqs[i])
		})
	}
	return g.Wait()
}

// putOpts are the options of an entry write with ttl.
func (x *Index) putOpts(ttl time.Duration, opts ...natsjs.PublishOpt) []natsjs.PublishOpt {
	opts = append(opts, natsjs.WithExpectStream(jetstream.IndexStream))
	if ttl > 0 && ttl != jetstream.TTLNever {
		opts = append(opts, natsjs.WithMsgTTL(jetstream.WholeSeconds(ttl)))
	}
	return opts
}

// purgeSubject removes the messages of one literal subject stored before
// sequence before.
func (x *Index) purgeSubject(ctx context.Context, subject string, before uint64) error {
	if err := x.stream.Purge(ctx, natsjs.WithPurgeSubject(subject), natsjs.WithPurgeSequence(before)); err != nil {
		return fmt.Errorf("jetflow: index: remove entries of %s: %w", subject, err)
	}
	return nil
}

// putAttributesIfAbsent is putIfAbsent for each of run's attributes: the
// rebuild's writes.
func (x *Index) putAttributesIfAbsent(run state.Run, ttl time.Duration) ([]natsjs.PubAckFuture, error) {
	if len(run.Attributes) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return nil, err
	}
	var out []natsjs.PubAckFuture
	for name, value := range run.Attributes {
		msg := &nats.Msg{Subject: attrSubject(name, value, run.RunID), Data: b, Header: nats.Header{}}
		f, err := x.js.PublishMsgAsync(msg, x.putOpts(ttl, natsjs.WithExpectLastSequencePerSubject(0))...)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// StandsFor reports whether e, an attribute entry, still stands for an
// attribute of run: run has e's attribute with e's value (an entry of
// another generation's attributes does not). A run's own entry always
// does.
func (e Entry) StandsFor(run state.Run) bool {
	if e.AttrName == "" {
		return true
	}
	v, ok := run.Attributes[e.AttrName]
	return ok && v == e.AttrValue
}
