package runs

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// batchReader reads run records for waits that start at once, in batches:
// a read asked for while a batch is on its way joins the next one, so ten
// thousand waits started together cost the server tens of reads, not ten
// thousand, and a lone wait's read goes out at once, as a single read would.
type batchReader struct {
	kv *jetstream.KV

	mu      sync.Mutex
	queue   []*batchRead
	running bool // a goroutine sends the queued reads
}

// batchRead is one read asked of a batchReader, answered on done.
type batchRead struct {
	runID string
	done  chan batchResult
}

type batchResult struct {
	run state.Run
	rev uint64
	err error
}

// maxBatchRead bounds the keys of one batch (the server answers a few
// thousand at most).
const maxBatchRead = 256

// batchReadTimeout bounds one batch, whatever its readers' contexts.
const batchReadTimeout = 10 * time.Second

// get reads the record of runID as Store.Get does (an error matching
// ErrNotFound when there is none), in the next batch (see read). A reader
// whose ctx ends gets ctx's error; its read still goes out with the batch.
func (b *batchReader) get(ctx context.Context, runID string) (state.Run, uint64, error) {
	select {
	case res := <-b.read(runID):
		return res.run, res.rev, res.err
	case <-ctx.Done():
		return state.Run{}, 0, ctx.Err()
	}
}

// read asks for the record of runID and returns where its answer comes: in
// the next batch, or, on a replicated bucket, whose batch reads may come
// from a replica that lags, Store.Get's own read from the stream leader.
func (b *batchReader) read(runID string) <-chan batchResult {
	r := &batchRead{runID: runID, done: make(chan batchResult, 1)}
	if b.kv.Replicated() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), batchReadTimeout)
			defer cancel()
			run, rev, err := decoded(b.kv.Get(ctx, runID))
			r.done <- batchResult{run, rev, err}
		}()
		return r.done
	}
	b.mu.Lock()
	b.queue = append(b.queue, r)
	if !b.running {
		b.running = true
		go b.send()
	}
	b.mu.Unlock()
	return r.done
}

// send reads what is queued, a batch at a time, until nothing is.
func (b *batchReader) send() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatchRead)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.answer(batch)
	}
}

// answer answers batch with one read of the latest record of each run ID.
func (b *batchReader) answer(batch []*batchRead) {
	keys := make([]string, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for _, r := range batch {
		if !seen[r.runID] {
			seen[r.runID] = true
			keys = append(keys, r.runID)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchReadTimeout)
	defer cancel()
	entries, err := b.kv.Last(ctx, keys...)
	if errors.Is(err, jetstream.ErrTooManyKeys) {
		// Fewer keys than the server's limit were asked for, but bigger
		// records than it returns in one answer: one read each.
		for _, r := range batch {
			run, rev, err := decoded(b.kv.Get(ctx, r.runID))
			r.done <- batchResult{run, rev, err}
		}
		return
	}
	byKey := make(map[string]jetstream.Entry, len(entries))
	for _, e := range entries {
		byKey[e.Key] = e
	}
	for _, r := range batch {
		e, ok := byKey[r.runID]
		switch {
		case err != nil:
			r.done <- batchResult{err: err}
		case !ok:
			r.done <- batchResult{err: jetstream.ErrNotFound}
		default:
			run, rev, err := decoded(e.Value, e.Rev, nil)
			r.done <- batchResult{run, rev, err}
		}
	}
}
