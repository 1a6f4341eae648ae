package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
)

// The index phase measures the run index (internal/runindex) with many
// kept runs:
//
//   - populate: --index-runs run records written through runs.Store, as the
//     engine writes them (Create running, then Finish for those that end),
//     from --index-goroutines goroutines, without running any workflow.
//     Every such write also writes the run's index entry, so the rate is the
//     index's write cost too; next to it, the same number of plain KV
//     creates of the same records into a bucket of its own, and the same
//     record writes (create, then an update for those that end) without an
//     index.
//   - pages: Client.ListRuns (newest first, by status, by workflow, by run
//     ID prefix, by time range, a deep page) and Client.CountRuns, each
//     repeated --index-samples times (p50/p99), next to the index page
//     alone (runindex.Index.Page) and the raw JetStream reads a page is
//     made of: one direct get, one batch direct get of a page's size.
//
// Every page is checked: non-empty, holding only runs that match its
// filter; the counts must add up to the runs written, by status and for
// one workflow. The phase fails otherwise.

const (
	// indexPageSize is the page size measured (the default of ListRuns).
	indexPageSize = 50
	// indexDeepPages is how many pages the deep page follows.
	indexDeepPages = 20
	// indexPrefix is the run ID prefix of the prefix page.
	indexPrefix = "order-1234"
	// indexRare is the rare workflow (1% of the runs).
	indexRare = "bench_index_rare"
	// indexCommon is how many common workflows share the other 99%.
	indexCommon = 7
	// indexProfilePhase, given to --profile-phase, profiles the index
	// phase's page measurements only (not its populate).
	indexProfilePhase = "index-pages"
)

// indexPlan is what the populate writes for run i: its workflow and its
// final status (running: it stays running).
type indexPlan struct {
	workflow []string
	status   []state.Status
}

// newIndexPlan draws the mix of n runs: 1% of the rare workflow, the rest
// spread over indexCommon workflows; ~90% completed, ~7% failed, ~2%
// running, ~1% cancelled. It is the same for the same n.
func newIndexPlan(n int) indexPlan {
	r := rand.New(rand.NewPCG(15, 200000))
	p := indexPlan{workflow: make([]string, n), status: make([]state.Status, n)}
	for i := range n {
		if r.Float64() < 0.01 {
			p.workflow[i] = indexRare
		} else {
			p.workflow[i] = indexWorkflow(r.IntN(indexCommon))
		}
		switch u := r.Float64(); {
		case u < 0.90:
			p.status[i] = state.StatusCompleted
		case u < 0.97:
			p.status[i] = state.StatusFailed
		case u < 0.99:
			p.status[i] = state.StatusRunning
		default:
			p.status[i] = state.StatusCancelled
		}
	}
	return p
}

func indexWorkflow(k int) string { return "bench_index_" + strconv.Itoa(k) }

func indexRunID(i int) string { return "order-" + strconv.Itoa(i) }

// counts is the plan's number of runs in each status, of workflow ("" for
// all).
func (p indexPlan) counts(workflow string) jetflow.RunCounts {
	var c jetflow.RunCounts
	for i, s := range p.status {
		if workflow != "" && p.workflow[i] != workflow {
			continue
		}
		switch s {
		case state.StatusRunning:
			c.Running++
		case state.StatusCompleted:
			c.Completed++
		case state.StatusFailed:
			c.Failed++
		case state.StatusCancelled:
			c.Cancelled++
		}
	}
	return c
}

// record is run i's record as created (running).
func (p indexPlan) record(i int, now time.Time) state.Run {
	return state.Run{V: state.Version, RunID: indexRunID(i), Workflow: p.workflow[i], Input: json.RawMessage(strconv.Itoa(i)),
		Status: state.StatusRunning, Token: "bench-" + strconv.Itoa(i), Source: "bench", CreatedAt: now, UpdatedAt: now}
}

// end makes r run i's final record.
func (p indexPlan) end(i int, r *state.Run, now time.Time) {
	r.Status, r.UpdatedAt = p.status[i], now
	switch r.Status {
	case state.StatusCompleted:
		r.Output = json.RawMessage("6")
	case state.StatusFailed:
		r.Error = &state.ErrorInfo{Message: "bench: planned failure", Kind: "workflow", Fatal: true}
	case state.StatusCancelled:
		r.Error = &state.ErrorInfo{Message: "cancelled", Kind: "cancelled", Fatal: true}
	}
}

// latency is p50 and p99 of a measured call.
type latency struct{ p50, p99 time.Duration }

func latencyOf(ds []time.Duration) latency {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return latency{p50: at(0.50), p99: at(0.99)}
}

// pageFigure is one measured page: the full ListRuns (or CountRuns) and,
// for a list, the index page alone.
type pageFigure struct {
	name  string
	full  latency
	index latency // zero for counts
	runs  int     // runs on the page (list), or runs counted
}

type indexFigures struct {
	n, goroutines, samples int
	populate               time.Duration // the runs.Store writes
	rawCreate              time.Duration // n plain KV creates
	rawRecords             time.Duration // n plain KV creates + an update for each run that ended
	indexFailures          int64
	pages                  []pageFigure
	indexGets, plainGets   directRefs // raw reads of the index stream, and of a plain stream of the same entries
	deepDepth              int        // the page the deep page measures (indexDeepPages unless fewer exist)
	indexMsgs, indexBytes  uint64
	runsBytes              uint64
}

var indexResults []indexFigures

// indexBench is what the index and attrs phases measure on: provisioned
// assets on a connection of their own, counting failed index writes, a
// run store and a client.
type indexBench struct {
	nc           *nats.Conn
	assets       *jetstream.Assets
	store        *runs.Store
	client       *jetflow.Client
	failures     atomic.Int64
	firstFailure atomic.Pointer[error]
}

func newIndexBench(ctx context.Context, e *env, name string) (*indexBench, error) {
	nc, err := e.conn(name)
	if err != nil {
		return nil, err
	}
	assets, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.Ensure)
	if err != nil {
		return nil, err
	}
	b := &indexBench{nc: nc, assets: assets, store: runs.New(assets)}
	// As a worker does at its start: the (empty) index is built, so its
	// marker is there and a listing reads it at once.
	if _, err := b.store.EnsureIndex(ctx); err != nil {
		return nil, err
	}
	assets.IndexFailed = func(_ string, err error) {
		b.failures.Add(1)
		b.firstFailure.CompareAndSwap(nil, &err)
	}
	if b.client, err = jetflow.NewClient(ctx, nc, jetflow.ClientConfig{Name: "bench-" + name, RequestTimeout: time.Minute}); err != nil {
		return nil, err
	}
	return b, nil
}

// populate writes cfg.indexRuns run records, record(i) each, from
// cfg.indexGoroutines goroutines, and ends those the plan ends, as
// workers do. It returns how long that took and the index writes that
// failed (an error when any did).
func (b *indexBench) populate(ctx context.Context, cfg config, plan indexPlan, record func(i int, now time.Time) state.Run) (time.Duration, int64, error) {
	took, err := parallel(ctx, cfg.indexRuns, cfg.indexGoroutines, func(ctx context.Context, i int) error {
		run := record(i, time.Now().UTC())
		rev, err := b.store.Create(ctx, run)
		if err != nil || plan.status[i] == state.StatusRunning {
			return err
		}
		_, written, err := b.store.Finish(ctx, run, rev, func(r *state.Run) { plan.end(i, r, time.Now().UTC()) })
		if err == nil && !written {
			err = fmt.Errorf("run %s: end not written", run.RunID)
		}
		return err
	})
	if err != nil {
		return took, 0, fmt.Errorf("populate: %w", err)
	}
	if n := b.failures.Load(); n > 0 {
		return took, n, fmt.Errorf("populate: %d index writes failed, the first: %w", n, *b.firstFailure.Load())
	}
	return took, 0, nil
}

// engineIndex is the index phase.
func engineIndex(ctx context.Context, e *env, cfg config) (f indexFigures, err error) {
	f = indexFigures{n: cfg.indexRuns, goroutines: cfg.indexGoroutines, samples: cfg.indexSamples}
	plan := newIndexPlan(cfg.indexRuns)
	b, err := newIndexBench(ctx, e, "index")
	if err != nil {
		return f, err
	}
	nc, assets, store, client := b.nc, b.assets, b.store, b.client
	before, err := client.CountRuns(ctx, "")
	if err != nil {
		return f, err
	}

	t0 := time.Now()
	f.populate, f.indexFailures, err = b.populate(ctx, cfg, plan, func(i int, now time.Time) state.Run { return plan.record(i, now) })
	if err != nil {
		return f, err
	}
	if f.rawCreate, f.rawRecords, err = rawIndexReference(ctx, e, cfg, plan); err != nil {
		return f, err
	}
	if err := indexStorage(ctx, assets, &f); err != nil {
		return f, err
	}

	if cfg.profilePhase == indexProfilePhase {
		stop, err := startProfile(cfg.cpuProfile)
		if err != nil {
			return f, err
		}
		defer stop()
	}
	if err := checkIndexCounts(ctx, client, plan, before, &f); err != nil {
		return f, err
	}
	// The time-range page: the middle fifth of the populate.
	since := t0.Add(f.populate * 2 / 5)
	until := t0.Add(f.populate * 3 / 5)
	lists := []struct {
		name  string
		opts  jetflow.ListOptions
		match func(jetflow.Run) bool
	}{
		{"newest first", jetflow.ListOptions{}, func(jetflow.Run) bool { return true }},
		{"status failed", jetflow.ListOptions{Status: jetflow.StatusFailed}, func(r jetflow.Run) bool { return r.Status == jetflow.StatusFailed }},
		{"workflow " + indexRare + " (1%)", jetflow.ListOptions{Workflow: indexRare}, func(r jetflow.Run) bool { return r.Workflow == indexRare }},
		{"run ID prefix " + indexPrefix, jetflow.ListOptions{RunIDPrefix: indexPrefix}, func(r jetflow.Run) bool { return strings.HasPrefix(r.RunID, indexPrefix) }},
		{"time range (middle fifth)", jetflow.ListOptions{Since: since, Until: until}, func(r jetflow.Run) bool {
			// UpdatedAt is taken just before the write the entry's time
			// comes from.
			return r.UpdatedAt.Before(until) && r.UpdatedAt.After(since.Add(-time.Second))
		}},
	}
	for _, l := range lists {
		l.opts.Limit = indexPageSize
		p, err := measurePage(ctx, client, store.Index(), l.name, l.opts, cfg.indexSamples, l.match)
		if err != nil {
			return f, err
		}
		f.pages = append(f.pages, p)
	}
	deep, depth, err := deepCursor(ctx, client)
	if err != nil {
		return f, err
	}
	f.deepDepth = depth
	p, err := measurePage(ctx, client, store.Index(), fmt.Sprintf("deep: page %d of newest first", depth),
		jetflow.ListOptions{After: deep, Limit: indexPageSize}, cfg.indexSamples, func(jetflow.Run) bool { return true })
	if err != nil {
		return f, err
	}
	f.pages = append(f.pages, p)
	for _, wf := range []string{"", indexWorkflow(0)} {
		p, err := measureCount(ctx, client, wf, cfg.indexSamples)
		if err != nil {
			return f, err
		}
		f.pages = append(f.pages, p)
	}
	info, err := assets.Index.Info(ctx)
	if err != nil {
		return f, err
	}
	if f.indexGets, err = rawDirectGets(ctx, nc, jetstream.IndexStream, "jetflow.runindex.e.>", info.State.FirstSeq, info.State.LastSeq, cfg.indexSamples); err != nil {
		return f, fmt.Errorf("index stream: %w", err)
	}
	if f.plainGets, err = rawPlainStream(ctx, e, cfg, plan); err != nil {
		return f, fmt.Errorf("plain stream: %w", err)
	}
	return f, nil
}

// directRefs are the raw reads a page is made of: one direct get, and a
// batch direct get of a page's size, of the newest messages (what a
// newest-first page reads) and from a random place, the latter also
// without a subject filter.
type directRefs struct{ single, newest, random, unfiltered latency }

// plainIndexStream is the raw reference's stream: the index's entries on
// subjects of the same shape, in a stream with JetStream's default limits.
const plainIndexStream = "BENCH_INDEX_PLAIN"

// rawPlainStream publishes an entry for each planned run to a plain stream
// (subjects shaped as the index's: status, workflow, one token a run ID
// character; no limit of messages per subject), times the raw reads on
// it, and deletes it.
func rawPlainStream(ctx context.Context, e *env, cfg config, plan indexPlan) (directRefs, error) {
	nc, err := e.conn("index-plain")
	if err != nil {
		return directRefs{}, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		return directRefs{}, err
	}
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: plainIndexStream, Subjects: []string{"bench.index.>"},
		Storage: natsjs.FileStorage, AllowDirect: true}); err != nil {
		return directRefs{}, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), plainIndexStream) }()
	now := time.Now().UTC()
	for i := range cfg.indexRuns {
		r := plan.record(i, now)
		plan.end(i, &r, now)
		b, err := json.Marshal(runindex.EntryOf(r))
		if err != nil {
			return directRefs{}, err
		}
		var subj strings.Builder
		subj.WriteString("bench.index.e." + string(r.Status) + "." + r.Workflow + ".")
		for _, c := range []byte(r.RunID) {
			subj.WriteByte(c)
			subj.WriteByte('.')
		}
		subj.WriteString("~")
		if _, err := js.PublishAsync(subj.String(), b); err != nil {
			return directRefs{}, err
		}
		if i%1024 == 1023 { // below the client's limit of outstanding async publishes (4,000)
			if err := waitPublished(ctx, js); err != nil {
				return directRefs{}, err
			}
		}
	}
	if err := waitPublished(ctx, js); err != nil {
		return directRefs{}, err
	}
	return rawDirectGets(ctx, nc, plainIndexStream, "bench.index.e.>", 1, uint64(cfg.indexRuns), cfg.indexSamples)
}

// waitPublished waits for every pending async publish's ack.
func waitPublished(ctx context.Context, js natsjs.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkIndexCounts checks that CountRuns, less what was kept before the
// populate, is the plan's count: of all runs, and of one workflow.
func checkIndexCounts(ctx context.Context, c *jetflow.Client, plan indexPlan, before jetflow.RunCounts, f *indexFigures) error {
	all, err := c.CountRuns(ctx, "")
	if err != nil {
		return err
	}
	all.Running -= before.Running
	all.Completed -= before.Completed
	all.Failed -= before.Failed
	all.Cancelled -= before.Cancelled
	if want := plan.counts(""); all != want {
		return fmt.Errorf("CountRuns: %+v more than before the populate, want %+v", all, want)
	}
	one, err := c.CountRuns(ctx, indexWorkflow(0))
	if err != nil {
		return err
	}
	if want := plan.counts(indexWorkflow(0)); one != want {
		return fmt.Errorf("CountRuns(%s): %+v, want %+v", indexWorkflow(0), one, want)
	}
	return nil
}

// measurePage times ListRuns(opts) and the index page alone, samples times
// each, and checks every page: non-empty, full (no entry left out: nothing
// changes while it is read), every run matching.
func measurePage(ctx context.Context, c *jetflow.Client, x *runindex.Index, name string, opts jetflow.ListOptions, samples int, match func(jetflow.Run) bool) (pageFigure, error) {
	q, err := indexQuery(opts)
	if err != nil {
		return pageFigure{}, err
	}
	full, idx := make([]time.Duration, samples), make([]time.Duration, samples)
	var got int
	for k := range samples {
		t := time.Now()
		ip, err := x.Page(ctx, q)
		idx[k] = time.Since(t)
		if err != nil {
			return pageFigure{}, fmt.Errorf("%s: index page: %w", name, err)
		}
		t = time.Now()
		page, err := c.ListRuns(ctx, opts)
		full[k] = time.Since(t)
		if err != nil {
			return pageFigure{}, fmt.Errorf("%s: %w", name, err)
		}
		if len(page.Runs) == 0 || len(page.Runs) != len(ip.Entries) {
			return pageFigure{}, fmt.Errorf("%s: %d runs listed, %d index entries: want as many, at least 1", name, len(page.Runs), len(ip.Entries))
		}
		for _, r := range page.Runs {
			if !match(r) {
				return pageFigure{}, fmt.Errorf("%s: run %s (%s, %s, updated %s) does not match", name, r.RunID, r.Workflow, r.Status, r.UpdatedAt.Format(time.RFC3339Nano))
			}
		}
		got = len(page.Runs)
	}
	return pageFigure{name: name, full: latencyOf(full), index: latencyOf(idx), runs: got}, nil
}

// indexQuery is the index query of opts, as ListRuns makes it.
func indexQuery(o jetflow.ListOptions) (runindex.Query, error) {
	before, err := runindex.ParseCursor(o.After)
	return runindex.Query{Status: state.Status(o.Status), Workflow: o.Workflow, Prefix: o.RunIDPrefix,
		Since: o.Since, Until: o.Until, Before: before, Limit: o.Limit, Attributes: o.Attributes}, err
}

// deepCursor follows newest-first pages up to page indexDeepPages and
// returns the cursor of the deepest page there is up to it, and its number.
func deepCursor(ctx context.Context, c *jetflow.Client) (string, int, error) {
	cursor, depth := "", 1
	for depth < indexDeepPages {
		page, err := c.ListRuns(ctx, jetflow.ListOptions{After: cursor, Limit: indexPageSize})
		if err != nil {
			return "", 0, fmt.Errorf("deep page %d: %w", depth, err)
		}
		if page.Next == "" {
			break
		}
		cursor, depth = page.Next, depth+1
	}
	return cursor, depth, nil
}

// measureCount times CountRuns(workflow) samples times.
func measureCount(ctx context.Context, c *jetflow.Client, workflow string, samples int) (pageFigure, error) {
	name := "CountRuns (all workflows)"
	if workflow != "" {
		name = "CountRuns (workflow " + workflow + ")"
	}
	ds := make([]time.Duration, samples)
	var n int64
	for k := range samples {
		t := time.Now()
		rc, err := c.CountRuns(ctx, workflow)
		ds[k] = time.Since(t)
		if err != nil {
			return pageFigure{}, fmt.Errorf("%s: %w", name, err)
		}
		n = rc.Running + rc.Completed + rc.Failed + rc.Cancelled
	}
	return pageFigure{name: name, full: latencyOf(ds), runs: int(n)}, nil
}

// rawIndexReference writes the plan's records to a plain bucket twice:
// plain KV creates of the final records (one write a run), then the record
// writes of the populate without the index (a create, and an update for
// each run that ended).
func rawIndexReference(ctx context.Context, e *env, cfg config, plan indexPlan) (create, records time.Duration, err error) {
	nc, err := e.conn("index-raw")
	if err != nil {
		return 0, 0, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		return 0, 0, err
	}
	const bucket = "bench_index_raw"
	kv, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: bucket, History: 1, Storage: natsjs.FileStorage})
	if err != nil {
		return 0, 0, fmt.Errorf("create bucket: %w", err)
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), bucket) }()
	create, err = parallel(ctx, cfg.indexRuns, cfg.indexGoroutines, func(ctx context.Context, i int) error {
		r := plan.record(i, time.Now().UTC())
		plan.end(i, &r, r.UpdatedAt)
		b, err := state.Encode(r)
		if err == nil {
			_, err = kv.Create(ctx, "c-"+r.RunID, b)
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("raw KV create: %w", err)
	}
	records, err = parallel(ctx, cfg.indexRuns, cfg.indexGoroutines, func(ctx context.Context, i int) error {
		r := plan.record(i, time.Now().UTC())
		b, err := state.Encode(r)
		if err != nil {
			return err
		}
		rev, err := kv.Create(ctx, "r-"+r.RunID, b)
		if err != nil || plan.status[i] == state.StatusRunning {
			return err
		}
		plan.end(i, &r, time.Now().UTC())
		if b, err = state.Encode(r); err == nil {
			_, err = kv.Update(ctx, "r-"+r.RunID, b, rev)
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("raw KV records: %w", err)
	}
	return create, records, nil
}

// indexStorage reads how much the index and the runs bucket hold.
func indexStorage(ctx context.Context, assets *jetstream.Assets, f *indexFigures) error {
	info, err := assets.Index.Info(ctx)
	if err != nil {
		return err
	}
	// Every message but the build's marker is an entry.
	f.indexMsgs, f.indexBytes = info.State.Msgs-1, info.State.Bytes
	st, err := assets.Runs.Raw().Status(ctx)
	if err != nil {
		return err
	}
	f.runsBytes = st.Bytes()
	return nil
}

// rawDirectGets times the raw reads a page is made of, on stream (whose
// messages on filter lie in [first, last]): one direct get (the first
// message on filter at or after a random sequence), and batch direct gets
// of indexPageSize messages on filter, from near the end (4 pages' worth
// of sequences before it: the index has gaps) and from a random sequence,
// with filter and without a filter. Each answer must hold what was asked.
func rawDirectGets(ctx context.Context, nc *nats.Conn, stream, filter string, first, last uint64, samples int) (directRefs, error) {
	subject := "$JS.API.DIRECT.GET." + stream
	r := rand.New(rand.NewPCG(1, 2))
	// Random sequences leave room for a whole batch after them.
	span := uint64(1)
	if last-first > 4*indexPageSize {
		span = last - first - 4*indexPageSize
	}
	seq := func() uint64 { return first + r.Uint64N(span) }
	newest := first
	if last-first > 4*indexPageSize {
		newest = last - 4*indexPageSize
	}
	one, near, many, all := make([]time.Duration, samples), make([]time.Duration, samples), make([]time.Duration, samples), make([]time.Duration, samples)
	for k := range samples {
		req := fmt.Sprintf(`{"seq":%d,"next_by_subj":%q}`, seq(), filter)
		t := time.Now()
		m, err := nc.RequestWithContext(ctx, subject, []byte(req))
		one[k] = time.Since(t)
		if err != nil {
			return directRefs{}, fmt.Errorf("raw direct get: %w", err)
		}
		if m.Header.Get("Status") != "" || len(m.Data) == 0 {
			return directRefs{}, fmt.Errorf("raw direct get: status %q", m.Header.Get("Status"))
		}
		for _, b := range []struct {
			from   uint64
			filter string
			into   []time.Duration
		}{{newest, filter, near}, {seq(), filter, many}, {seq(), "", all}} {
			t = time.Now()
			n, err := batchDirectGet(ctx, nc, subject, fmt.Sprintf(`{"seq":%d,"next_by_subj":%q,"batch":%d}`, b.from, b.filter, indexPageSize))
			b.into[k] = time.Since(t)
			if err != nil {
				return directRefs{}, err
			}
			if n != indexPageSize {
				return directRefs{}, fmt.Errorf("raw batch direct get from %d: %d messages, want %d", b.from, n, indexPageSize)
			}
		}
	}
	return directRefs{single: latencyOf(one), newest: latencyOf(near), random: latencyOf(many), unfiltered: latencyOf(all)}, nil
}

// batchDirectGet sends a batch direct get and counts the messages of its
// answer, up to its end-of-batch status.
func batchDirectGet(ctx context.Context, nc *nats.Conn, subject, req string) (int, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, []byte(req)); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for n := 0; ; n++ {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return n, fmt.Errorf("raw batch direct get: %w", err)
		}
		switch code := m.Header.Get("Status"); code {
		case "":
		case "204":
			return n, nil
		default:
			return n, fmt.Errorf("raw batch direct get: status %s %s", code, m.Header.Get("Description"))
		}
	}
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// indexTarget is the bound on a page with 200,000 kept runs.
const indexTarget = 50 * time.Millisecond

// printIndexReport prints the index phase's figures.
func printIndexReport(out io.Writer, r *results) {
	if len(indexResults) == 0 {
		return
	}
	f := indexResults[len(indexResults)-1] // one repetition is enough: each is checked whole
	if len(indexResults) > 1 {
		fmt.Fprintf(out, "index: figures of the last of %d repetitions\n", len(indexResults))
	}
	ended := 0
	plan := newIndexPlan(f.n)
	for _, s := range plan.status {
		if s != state.StatusRunning {
			ended++
		}
	}
	c := plan.counts("")
	fmt.Fprintf(out, "index: %s kept runs (%s completed, %s failed, %s running, %s cancelled; %d workflows, %s of them 1%%) written by runs.Store from %d goroutines; pages of %d, each measured %d times\n",
		num(float64(f.n)), num(float64(c.Completed)), num(float64(c.Failed)), num(float64(c.Running)), num(float64(c.Cancelled)),
		indexCommon+1, indexRare, f.goroutines, indexPageSize, f.samples)
	rate := func(d time.Duration) float64 { return float64(f.n) / d.Seconds() }
	pop, rawC, rawR := rate(f.populate), rate(f.rawCreate), rate(f.rawRecords)
	rows := [][4]string{
		{"populate runs/s (record + index entry writes)", num(pop), "raw KV create/s " + num(rawC), ratio(pop, rawC)},
		{"  the same records without the index", "", "raw KV create+update/s " + num(rawR), ratio(pop, rawR)},
		{"index entries / bytes per run", num(float64(f.indexMsgs)) + " / " + dec(float64(f.indexBytes)/float64(max(1, f.indexMsgs))),
			"run record bytes per run " + dec(float64(f.runsBytes)/float64(f.n)), ""},
	}
	fmt.Fprintf(out, "  (a run that ends costs 5 requests: record create, entry publish, record update, entry publish, purge of the older entry; %s of %s runs ended)\n",
		num(float64(ended)), num(float64(f.n)))
	rows = append(rows,
		[4]string{"raw direct get, 1 msg, index stream: p50 / p99 ms", ms(f.indexGets.single.p50) + " / " + ms(f.indexGets.single.p99),
			"plain stream " + ms(f.plainGets.single.p50) + " / " + ms(f.plainGets.single.p99), ratio(float64(f.indexGets.single.p50), float64(f.plainGets.single.p50))},
		[4]string{"raw batch direct get, 50 newest msgs, index stream: p50 / p99 ms", ms(f.indexGets.newest.p50) + " / " + ms(f.indexGets.newest.p99),
			"plain stream " + ms(f.plainGets.newest.p50) + " / " + ms(f.plainGets.newest.p99), ratio(float64(f.indexGets.newest.p50), float64(f.plainGets.newest.p50))},
		[4]string{"raw batch direct get, 50 msgs from a random place: p50 / p99 ms", ms(f.indexGets.random.p50) + " / " + ms(f.indexGets.random.p99),
			"plain stream " + ms(f.plainGets.random.p50) + " / " + ms(f.plainGets.random.p99), ratio(float64(f.indexGets.random.p50), float64(f.plainGets.random.p50))},
		[4]string{"  the same without a subject filter: p50 / p99 ms", ms(f.indexGets.unfiltered.p50) + " / " + ms(f.indexGets.unfiltered.p99),
			"plain stream " + ms(f.plainGets.unfiltered.p50) + " / " + ms(f.plainGets.unfiltered.p99), ratio(float64(f.indexGets.unfiltered.p50), float64(f.plainGets.unfiltered.p50))},
	)
	var missed []string
	for _, p := range f.pages {
		ref, rt := "", ""
		if p.index != (latency{}) {
			ref = "index page alone " + ms(p.index.p50) + " / " + ms(p.index.p99)
			rt = ratio(float64(p.full.p50), float64(f.plainGets.newest.p50)) + " x plain newest batch"
		}
		rows = append(rows, [4]string{fmt.Sprintf("%s (%s runs): p50 / p99 ms", p.name, num(float64(p.runs))),
			ms(p.full.p50) + " / " + ms(p.full.p99), ref, rt})
		if p.full.p99 >= indexTarget {
			missed = append(missed, p.name)
		}
	}
	printTable(out, [4]string{"metric", "jetflow", "reference", "ratio (p50)"}, rows)
	for _, p := range f.pages {
		if p.index == (latency{}) || p.full.p50 == 0 {
			continue
		}
		rest := p.full.p50 - p.index.p50
		reads := ms(rest) + " ms (" + ms(rest/time.Duration(max(1, p.runs))) + " ms a run)"
		if rest <= 0 { // two medians measured apart: the reads are within their noise
			reads = "within the noise (ListRuns's p50 is not above the index page's)"
		}
		fmt.Fprintf(out, "  where %s's time goes (p50): index page %s ms (%.0f%% of ListRuns), run records and audits %s\n",
			p.name, ms(p.index.p50), 100*float64(p.index.p50)/float64(p.full.p50), reads)
	}
	if len(missed) == 0 {
		fmt.Fprintf(out, "index: every page and count within the %s target at p99\n", indexTarget)
	} else {
		fmt.Fprintf(out, "index: p99 at or over the %s target: %s\n", indexTarget, strings.Join(missed, "; "))
	}
	fmt.Fprintln(out)
}
