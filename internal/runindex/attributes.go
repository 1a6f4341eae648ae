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
//	jetflow.runindex.a.<name>.<value in hex>.<status>.<workflow>.<run ID>
//
// so that the runs with an attribute's value — of a status, of a
// workflow, or any — are a subject filter the server answers from its
// subject index: a page by attribute walks those entries only. The value
// is hex-encoded because a value may hold any printable character (dots
// and spaces included), which a subject token may not; equality is all a
// query asks, so the value is one token. An attribute entry holds the same
// Entry as the run's own entry and is written after it at every status
// change, with the same expiry, then the one of the state the run left is
// removed (a literal subject, as for the run's entry), so it orders and
// expires like the run's entry. A run without attributes writes none.
const attrPrefix = subjectPrefix + "a."

// attrSubject is the subject of runID's entry for attribute name=value in
// status and workflow; "" for either is "*", a filter.
func attrSubject(name, value string, status state.Status, workflow, runID string) string {
	return attrPrefix + name + "." + hex.EncodeToString([]byte(value)) + "." + orAny(string(status)) + "." + orAny(workflow) + "." + runID
}

// attrFilter matches the entries of every run with attribute name=value,
// in status and of workflow ("" for any).
func attrFilter(name, value string, status state.Status, workflow string) string {
	return attrSubject(name, value, status, workflow, "*")
}

// parseAttrSubject reads the attribute of an attribute entry's subject; ok
// is false for any other subject.
func parseAttrSubject(subject string) (name, value string, ok bool) {
	rest, found := strings.CutPrefix(subject, attrPrefix)
	if !found {
		return "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 5 {
		return "", "", false
	}
	v, err := hex.DecodeString(parts[1])
	if err != nil {
		return "", "", false
	}
	return parts[0], string(v), true
}

// AttrSeqs are the sequences of a run's attribute entries just written,
// by attribute name.
type AttrSeqs map[string]uint64

// PutAttributes writes run's entry under each of its attributes with ttl
// (as Put takes it), all in flight at once, and returns their sequences.
// Earlier attribute entries of the run stay: the caller removes them
// (RemoveAttributes). A run without attributes writes nothing.
func (x *Index) PutAttributes(ctx context.Context, run state.Run, ttl time.Duration) (AttrSeqs, error) {
	if len(run.Attributes) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(run.Attributes))
	acks := make([]natsjs.PubAckFuture, len(names))
	for i, name := range names {
		msg := &nats.Msg{Subject: attrSubject(name, run.Attributes[name], run.Status, run.Workflow, run.RunID), Data: b, Header: nats.Header{}}
		if acks[i], err = x.js.PublishMsgAsync(msg, x.putOpts(ttl)...); err != nil {
			return nil, fmt.Errorf("jetflow: index run %s: attribute %s: %w", run.RunID, name, err)
		}
	}
	seqs := make(AttrSeqs, len(names))
	for i, f := range acks {
		select {
		case ack := <-f.Ok():
			seqs[names[i]] = ack.Sequence
		case err := <-f.Err():
			return nil, fmt.Errorf("jetflow: index run %s: attribute %s: %w", run.RunID, names[i], err)
		case <-ctx.Done():
			return nil, fmt.Errorf("jetflow: index run %s: attributes: %w", run.RunID, ctx.Err())
		}
	}
	return seqs, nil
}

// RemoveAttributes removes runID's entries of attrs in status and of
// workflow (both "": in any state, a wildcard the server answers by
// visiting the blocks between the run's entries; not for the path of
// every run) stored before before[name] (exclusive): after a status
// change, the entries of the state the run left, bounded by the new
// ones' sequences so that an entry a later writer made stays. The purges
// go out at once.
func (x *Index) RemoveAttributes(ctx context.Context, attrs map[string]string, status state.Status, workflow, runID string, before AttrSeqs) error {
	g, gctx := errgroup.WithContext(ctx)
	for name, value := range attrs {
		if before[name] == 0 {
			continue
		}
		g.Go(func() error {
			return x.purgeSubject(gctx, attrSubject(name, value, status, workflow, runID), before[name])
		})
	}
	return g.Wait()
}

// Next is seqs, each one more: the bound that removes the entries seqs
// name too.
func (seqs AttrSeqs) Next() AttrSeqs {
	out := make(AttrSeqs, len(seqs))
	for name, seq := range seqs {
		out[name] = seq + 1
	}
	return out
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
// rebuild's writes, in name order.
func (x *Index) putAttributesIfAbsent(run state.Run, ttl time.Duration) ([]natsjs.PubAckFuture, []string, error) {
	if len(run.Attributes) == 0 {
		return nil, nil, nil
	}
	b, err := json.Marshal(EntryOf(run))
	if err != nil {
		return nil, nil, err
	}
	names := slices.Sorted(maps.Keys(run.Attributes))
	out := make([]natsjs.PubAckFuture, 0, len(names))
	for _, name := range names {
		msg := &nats.Msg{Subject: attrSubject(name, run.Attributes[name], run.Status, run.Workflow, run.RunID), Data: b, Header: nats.Header{}}
		f, err := x.js.PublishMsgAsync(msg, x.putOpts(ttl, natsjs.WithExpectLastSequencePerSubject(0))...)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, f)
	}
	return out, names, nil
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
