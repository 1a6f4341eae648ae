package runindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Query selects a page of the index.
type Query struct {
	Status   state.Status // "" for all
	Workflow string       // "" for all
	Prefix   string       // run ID prefix, "" for all
	// Since and Until bound the time of the entry (the run's last status
	// change) to [Since, Until); zero for open.
	Since, Until time.Time
	// Before is the cursor: only entries older than it (0: from the
	// newest).
	Before uint64
	Limit  int
	// Attributes select the runs with all these attributes (nil for
	// all): the page walks the entries of the one that fewest entries
	// have (Rarest) in Status and of Workflow (both part of an attribute
	// entry's subject), and checks the prefix on each entry; the other
	// attributes are the caller's to check on the records.
	Attributes map[string]string
	// AttrName and AttrValue are the attribute whose entries the page
	// walks (set by Page).
	AttrName, AttrValue string
}

// admits reports whether e is within q's Since and Until, and, for a page
// by attribute (whose subject filter names the attribute, the status and
// the workflow), of q's run ID prefix.
func (q Query) admits(e Entry) bool {
	inTime := (q.Since.IsZero() || !e.UpdatedAt.Before(q.Since)) && (q.Until.IsZero() || e.UpdatedAt.Before(q.Until))
	return inTime && (q.AttrName == "" || strings.HasPrefix(e.RunID, q.Prefix))
}

// Page is a page of entries, newest first, and the cursor of the next
// (0 when this one is the last).
type Page struct {
	Entries []Entry
	Next    uint64
}

// Scanning parameters. A page reads the stream backwards in windows of
// sequences, each twice the last, until it holds Limit entries. A filter
// that matches few entries among many would make that a long walk; once a
// walk has covered scanBudget sequences (at once for a run ID prefix), the
// page asks the server once for the last entry of every matching subject
// below the window instead (one request, answered from the subject
// index), which it gets whenever at most multiLastMax entries match.
const (
	minWindow    = 128
	scanBudget   = 32 * 1024
	multiLastMax = 1024
)

// Page returns the entries q selects, newest first: at most q.Limit, and
// Next when older ones may follow. Its cost depends on the page size and
// on how densely the filter matches the newest entries, not on how many
// entries the index holds.
func (x *Index) Page(ctx context.Context, q Query) (Page, error) {
	if len(q.Attributes) > 0 {
		var err error
		if q.AttrName, err = x.Rarest(ctx, q.Attributes, q.Status, q.Workflow); err != nil {
			return Page{}, err
		}
		q.AttrValue = q.Attributes[q.AttrName]
	}
	first, last, err := x.bounds(ctx)
	if err != nil {
		return Page{}, err
	}
	hi := last + 1 // exclusive
	if q.Before > 0 {
		hi = min(hi, q.Before)
	}
	lo := first
	// Entries are in time order after the marker of the last build: a
	// build writes the runs' entries in the order of their records' writes,
	// beside live writes of runs that change meanwhile, so before the
	// marker an entry's place says nothing of its time. A time bound that
	// falls there is applied to the entries' times alone (admits).
	var ordered uint64
	if !q.Since.IsZero() || !q.Until.IsZero() {
		if ordered, err = x.builtAt(ctx); err != nil {
			return Page{}, err
		}
	}
	// An attribute entry is written just after its run's entry, so it may
	// follow the first entry at Until: a page by attribute is bounded by
	// the entries' times alone at that end.
	if !q.Until.IsZero() && q.AttrName == "" {
		s, err := x.seqAt(ctx, q.Until, first, last)
		if err != nil {
			return Page{}, err
		}
		hi = min(hi, max(s, ordered))
	}
	if !q.Since.IsZero() {
		s, err := x.seqAt(ctx, q.Since, first, last)
		if err != nil {
			return Page{}, err
		}
		if s > ordered {
			lo = max(lo, s)
		}
	}
	filter := q.filter()
	// got holds the newest entry of each run found, newest first: a run
	// has two entries for a moment after a write (the new entry is
	// written before the old one is removed), and shows once.
	var got []Entry
	seen := map[string]bool{}
	add := func(got, es []Entry) []Entry {
		for _, e := range es {
			if !q.admits(e) {
				continue // out of order by a little, at a bound; or another status or workflow
			}
			if !seen[e.RunID] {
				seen[e.RunID] = true
				got = append(got, e)
			}
		}
		return got
	}
	window, scanned := uint64(max(minWindow, 4*q.Limit)), uint64(0)
	// A prefix or an attribute selects few runs as a rule, scattered over
	// the whole index: ask for them at once first.
	askedAll := false
	for hi > lo && len(got) <= q.Limit {
		if !askedAll && (scanned >= scanBudget || q.Prefix != "" || q.AttrName != "") {
			askedAll = true
			older, ok, err := x.lastPerSubject(ctx, filter, lo, hi)
			if err != nil {
				return Page{}, err
			}
			if ok {
				got, hi = add(got, older), lo
				break
			}
		}
		from := max(lo, satSub(hi, window))
		es, err := x.rangeEntries(ctx, filter, from, hi)
		if err != nil {
			return Page{}, err
		}
		slices.Reverse(es)
		got = add(got, es)
		scanned += hi - from
		hi, window = from, min(2*window, 1<<20)
	}
	page := Page{Entries: got}
	if len(got) > q.Limit {
		page.Entries = got[:q.Limit]
	}
	if len(got) > q.Limit {
		page.Next = page.Entries[len(page.Entries)-1].Seq
	}
	return page, nil
}

func satSub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// bounds reads the stream's first and last sequence.
func (x *Index) bounds(ctx context.Context) (first, last uint64, err error) {
	info, err := x.stream.Info(ctx)
	if err != nil {
		return 0, 0, missing(fmt.Errorf("jetflow: run index: %w", err))
	}
	return info.State.FirstSeq, info.State.LastSeq, nil
}

// seqAt is the sequence of the first entry whose time (UpdatedAt: the
// run's status change it records) is t or later, or last+1 when there is
// none. Entries are stored in about the order of their times (a rebuild
// writes them in the order of their records' writes), so a binary search
// over sequences finds it with about log2(entries) single gets. It reads
// the entries' own times, not the stream's: a rebuilt index's messages
// all carry the time of the rebuild.
func (x *Index) seqAt(ctx context.Context, t time.Time, first, last uint64) (uint64, error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		msgs, _, err := x.direct(ctx, directRequest{Seq: mid, NextFor: entryPrefix + ">"})
		if err != nil {
			return 0, err
		}
		if len(msgs) == 0 {
			hi = mid // no entry from mid on
			continue
		}
		e, err := decodeEntry(msgs[0])
		if err != nil {
			return 0, err
		}
		switch {
		case e.Seq >= hi:
			hi = mid // none in [mid, hi)
		case e.UpdatedAt.Before(t):
			lo = e.Seq + 1
		default:
			hi = mid
		}
	}
	return lo, nil
}

// rangeEntries reads the entries matching filter with sequences in
// [from, to), oldest first. It walks the range with single direct gets
// (each the next entry matching filter from a sequence), in rangeWalkers
// parts at once: a batched get would make the server count every entry
// matching filter from its start to the stream's end first, which costs
// as much as the stream holds beyond the range.
func (x *Index) rangeEntries(ctx context.Context, filter string, from, to uint64) ([]Entry, error) {
	parts := min(uint64(rangeWalkers), max(1, (to-from)/minPart))
	size := (to - from + parts - 1) / parts
	found := make([][]Entry, parts)
	g, gctx := errgroup.WithContext(ctx)
	for i := range parts {
		lo, hi := from+i*size, min(to, from+(i+1)*size)
		g.Go(func() (err error) {
			found[i], err = x.walk(gctx, filter, lo, hi)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return slices.Concat(found...), nil
}

// Walking parameters: at most rangeWalkers parts of a range at once, each
// of at least minPart sequences.
const (
	rangeWalkers = 8
	minPart      = 64
)

// walk reads the entries matching filter in [from, to), oldest first, one
// direct get each.
func (x *Index) walk(ctx context.Context, filter string, from, to uint64) ([]Entry, error) {
	var out []Entry
	for from < to {
		msgs, _, err := x.direct(ctx, directRequest{Seq: from, NextFor: filter})
		if err != nil || len(msgs) == 0 {
			return out, err
		}
		e, err := decodeEntry(msgs[0])
		if err != nil {
			return nil, err
		}
		if e.Seq >= to {
			return out, nil
		}
		out = append(out, e)
		from = e.Seq + 1
	}
	return out, nil
}

// lastPerSubject reads every entry matching filter with a sequence in
// [from, to), newest first, in one request — when at most multiLastMax
// subjects match below to; ok is false when more do.
func (x *Index) lastPerSubject(ctx context.Context, filter string, from, to uint64) ([]Entry, bool, error) {
	if to <= 1 {
		return nil, true, nil
	}
	msgs, status, err := x.direct(ctx, directRequest{MultiLastFor: []string{filter}, UpToSeq: to - 1})
	if err != nil {
		return nil, false, err
	}
	if status == "413" {
		return nil, false, nil
	}
	var out []Entry
	for _, m := range msgs {
		e, err := decodeEntry(m)
		if err != nil {
			return nil, false, err
		}
		if e.Seq >= from && e.Seq < to {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmpDesc(a.Seq, b.Seq) })
	return out, true, nil
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// Rarest is the name of the attribute of attrs that the fewest entries
// in status and of workflow ("" for any) have: one request per attribute
// (none for one), answered from the server's subject index. Ties go to
// the first name in order.
func (x *Index) Rarest(ctx context.Context, attrs map[string]string, status state.Status, workflow string) (string, error) {
	names := slices.Sorted(maps.Keys(attrs))
	if len(names) == 1 {
		return names[0], nil
	}
	best, fewest := "", int64(-1)
	for _, name := range names {
		n, err := x.count(ctx, attrFilter(name, attrs[name], status, workflow))
		if err != nil {
			return "", err
		}
		if fewest < 0 || n < fewest {
			best, fewest = name, n
		}
	}
	return best, nil
}

// count counts the entries matching filter.
func (x *Index) count(ctx context.Context, filter string) (int64, error) {
	msgs, _, err := x.direct(ctx, directRequest{Seq: 1, NextFor: filter, Batch: 1})
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	pending, err := strconv.ParseInt(msgs[0].Header.Get("Nats-Num-Pending"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("jetflow: run index: count %s: pending %q: %w", filter, msgs[0].Header.Get("Nats-Num-Pending"), err)
	}
	return pending + 1, nil
}

// Counts is the number of kept runs in each status.
type Counts map[state.Status]int64

// Count counts the entries of each status, of workflow ("" for all). It
// costs one request per status, answered from the server's subject index.
func (x *Index) Count(ctx context.Context, workflow string) (Counts, error) {
	out := Counts{}
	for _, s := range []state.Status{state.StatusRunning, state.StatusBlocked, state.StatusCompleted, state.StatusFailed, state.StatusCancelled} {
		n, err := x.count(ctx, Query{Status: s, Workflow: workflow}.filter())
		if err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, nil
}

func decodeEntry(m *nats.Msg) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return Entry{}, fmt.Errorf("%w: index entry %s: %w", state.ErrCorrupt, m.Subject, err)
	}
	seq, err := seqOf(m)
	if err != nil {
		return Entry{}, err
	}
	e.Seq = seq
	e.AttrName, e.AttrValue, _ = parseAttrSubject(m.Subject)
	return e, nil
}

func seqOf(m *nats.Msg) (uint64, error) {
	seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("jetflow: run index: message without a sequence: %w", err)
	}
	return seq, nil
}

// directRequest is a JetStream direct-get request (batched or multi-last).
type directRequest struct {
	Seq          uint64     `json:"seq,omitempty"`
	NextFor      string     `json:"next_by_subj,omitempty"`
	LastFor      string     `json:"last_by_subj,omitempty"`
	Batch        int        `json:"batch,omitempty"`
	StartTime    *time.Time `json:"start_time,omitempty"`
	MultiLastFor []string   `json:"multi_last,omitempty"`
	UpToSeq      uint64     `json:"up_to_seq,omitempty"`
}

// direct sends req to the index stream's direct-get service and collects
// the messages of its answer. A batch or multi answer ends with a status
// message (204 end of batch, 404 nothing found, 413 too many); status is
// its code, and 404 is an empty answer, not an error.
func (x *Index) direct(ctx context.Context, req directRequest) (msgs []*nats.Msg, status string, err error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, "", err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	single := req.Batch == 0 && len(req.MultiLastFor) == 0
	if single {
		m, err := x.nc.RequestWithContext(ctx, directSubject, b)
		if err != nil {
			return nil, "", x.requestErr(err)
		}
		return answer(m, nil, true)
	}
	inbox := x.nc.NewRespInbox()
	sub, err := x.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, "", jetstream.Unavailable(fmt.Errorf("jetflow: run index: %w", err))
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := x.nc.PublishRequest(directSubject, inbox, b); err != nil {
		return nil, "", jetstream.Unavailable(fmt.Errorf("jetflow: run index: %w", err))
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, "", x.requestErr(err)
		}
		var done bool
		if msgs, status, done, err = answerPart(m, msgs); done || err != nil {
			return msgs, status, err
		}
	}
}

// directSubject is where the index stream's direct gets are asked.
const directSubject = "$JS.API.DIRECT.GET." + jetstream.IndexStream

// requestErr is the error of a direct get that got no answer: a missing
// stream (no responders) or a transient condition.
func (x *Index) requestErr(err error) error {
	if errors.Is(err, nats.ErrNoResponders) {
		return missing(fmt.Errorf("jetflow: run index: %w", err))
	}
	return jetstream.Unavailable(fmt.Errorf("jetflow: run index read: %w", err))
}

// answer is the answer of a single direct get: its message, or none (404).
func answer(m *nats.Msg, msgs []*nats.Msg, _ bool) ([]*nats.Msg, string, error) {
	msgs, status, done, err := answerPart(m, msgs)
	if !done && err == nil {
		return msgs, "", nil
	}
	return msgs, status, err
}

// answerPart adds m, one message of a direct get's answer, to msgs; done
// is true when m is the status message that ends the answer (204 end of
// batch, 404 nothing found, 413 too many: not errors), whose code status
// is.
func answerPart(m *nats.Msg, msgs []*nats.Msg) (_ []*nats.Msg, status string, done bool, _ error) {
	code := m.Header.Get("Status")
	switch code {
	case "":
		return append(msgs, m), "", false, nil
	case "204", "404", "413":
		return msgs, code, true, nil
	case "503":
		return nil, code, true, missing(fmt.Errorf("jetflow: run index: %w", nats.ErrNoResponders))
	}
	return nil, code, true, fmt.Errorf("jetflow: run index read: %s %s", code, m.Header.Get("Description"))
}
