package jetstream

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// DirectRequest is a JetStream direct-get request that can be answered
// with several messages (batched, or the last message of each subject that
// matches a filter).
type DirectRequest struct {
	Seq          uint64     `json:"seq,omitempty"`
	NextFor      string     `json:"next_by_subj,omitempty"`
	Batch        int        `json:"batch,omitempty"`
	StartTime    *time.Time `json:"start_time,omitempty"`
	MultiLastFor []string   `json:"multi_last,omitempty"`
}

// directMux answers multi-message direct gets on one wildcard subscription
// of a connection, so that a read costs the request alone: no subscribe and
// unsubscribe per call (which a plain inbox per call would cost).
type directMux struct {
	nc     *nats.Conn
	once   sync.Once
	err    error
	prefix string // <inbox>.
	next   atomic.Uint64

	mu      sync.Mutex
	pending map[string]chan *nats.Msg
	// closed is closed when the subscription ends (the connection
	// closed): no answer comes any more.
	closed chan struct{}
}

func newDirectMux(nc *nats.Conn) *directMux {
	return &directMux{nc: nc, pending: make(map[string]chan *nats.Msg), closed: make(chan struct{})}
}

// start subscribes once, on the first request.
func (m *directMux) start() error {
	m.once.Do(func() {
		m.prefix = m.nc.NewInbox() + "."
		var sub *nats.Subscription
		sub, m.err = m.nc.Subscribe(m.prefix+"*", func(msg *nats.Msg) {
			m.mu.Lock()
			ch := m.pending[msg.Subject]
			m.mu.Unlock()
			if ch != nil {
				select {
				case ch <- msg:
				default: // a reader that gave up; its answer is dropped
				}
			}
		})
		if m.err == nil {
			sub.SetClosedHandler(func(string) { close(m.closed) })
		}
	})
	return m.err
}

// request sends req to stream's direct-get service and returns the messages
// of its answer, and the status that ended it: 204 (end of batch), 404
// (nothing matched: no messages, not an error), 413 (more than the server
// returns at once; msgs holds what it sent). A stream that does not exist
// is an error matching nats.ErrNoResponders.
func (m *directMux) request(ctx context.Context, stream string, req DirectRequest) (msgs []*nats.Msg, status string, err error) {
	if err := m.start(); err != nil {
		return nil, "", Unavailable(fmt.Errorf("jetflow: direct get %s: %w", stream, err))
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, "", err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	reply := m.prefix + strconv.FormatUint(m.next.Add(1), 36)
	// The answer streams in; the buffer takes a full answer (the server
	// sends at most 1,024 messages) so the subscription never blocks.
	ch := make(chan *nats.Msg, 1100)
	m.mu.Lock()
	m.pending[reply] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.pending, reply)
		m.mu.Unlock()
	}()
	if err := m.nc.PublishRequest("$JS.API.DIRECT.GET."+stream, reply, b); err != nil {
		return nil, "", Unavailable(fmt.Errorf("jetflow: direct get %s: %w", stream, err))
	}
	for {
		select {
		case <-ctx.Done():
			return nil, "", Unavailable(fmt.Errorf("jetflow: direct get %s: %w", stream, ctx.Err()))
		case <-m.closed:
			return nil, "", Unavailable(fmt.Errorf("jetflow: direct get %s: %w", stream, nats.ErrConnectionClosed))
		case msg := <-ch:
			code := msg.Header.Get("Status")
			switch code {
			case "":
				msgs = append(msgs, msg)
				continue
			case "204", "404", "413":
				return msgs, code, nil
			case "503":
				return nil, code, fmt.Errorf("jetflow: direct get %s: %w", stream, nats.ErrNoResponders)
			}
			return nil, code, fmt.Errorf("jetflow: direct get %s: %s %s", stream, code, msg.Header.Get("Description"))
		}
	}
}

// Entry is one key of a bucket as a batch read returned it.
type Entry struct {
	Key   string
	Value []byte
	Rev   uint64
}

// Prefix reads the latest value of every key under prefix (the keys
// <prefix>.<anything>), in revision order. Up to 1,024 keys take one
// direct get, which the server answers isolated from writes: a consistent
// snapshot of the keys at one point of the bucket's history. More keys are
// read in batches of 1,024 in revision order, each a snapshot of its own.
// Keys whose latest message is a delete, purge or expiry marker are left
// out.
//
// upTo > 0 reads only the keys whose latest value was written at or
// before that revision of the bucket: a key written after it is left out,
// as if not written yet, and so is a key rewritten or deleted after it (a
// bucket keeps one value per key, its latest). The cut is made here, not
// by the server: its multi-last read with an upper bound looks for an
// earlier revision of every key written after the bound, which a bucket
// that keeps one revision per key does not have, through all of the
// stream's blocks.
func (k *KV) Prefix(ctx context.Context, prefix string, upTo uint64) ([]Entry, error) {
	out, err := k.Matching(ctx, prefix+".>")
	if err != nil {
		return nil, err
	}
	if upTo > 0 {
		out = slices.DeleteFunc(out, func(e Entry) bool { return e.Rev > upTo })
	}
	return out, nil
}

// Matching reads the latest value of every key that filter (a key with
// wildcards, such as "run-1.*.*.wait") matches, in revision order, the way
// Prefix does: one snapshot for up to 1,024 keys, batches of 1,024 beyond.
func (k *KV) Matching(ctx context.Context, filter string) ([]Entry, error) {
	subject := k.prefix + filter
	msgs, status, err := k.direct.request(ctx, "KV_"+k.Bucket(), DirectRequest{MultiLastFor: []string{subject}})
	for status == "413" && err == nil {
		// More keys than one answer holds: walk their messages in
		// revision order (every revision; the latest of each key wins).
		var page []*nats.Msg
		seq := uint64(1)
		if n := len(msgs); n > 0 {
			seq = msgSeq(msgs[n-1]) + 1
		}
		page, status, err = k.direct.request(ctx, "KV_"+k.Bucket(), DirectRequest{Seq: seq, NextFor: subject, Batch: 1024})
		msgs = append(msgs, page...)
		if status == "204" && len(page) == 1024 {
			status = "413" // a full page: there may be more
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jetflow: read %s/%s: %w", k.Bucket(), filter, err)
	}
	return k.entries(msgs), nil
}

// PrefixFenced reads like Prefix (latest values), with a guard against a
// stale answer: fenceKey, a key under prefix, must appear in the snapshot
// at revision minRev or later, and, in a replicated bucket (whose direct
// gets a lagging replica may answer), at the revision the stream leader
// holds when the read begins or later. An answer that holds an older
// revision is read again until ctx ends. A snapshot that passes holds
// every write of the bucket up to that revision of fenceKey.
func (k *KV) PrefixFenced(ctx context.Context, prefix, fenceKey string, minRev uint64) ([]Entry, error) {
	type leader struct {
		rev uint64
		err error
	}
	var atLeader chan leader
	if k.replicated {
		atLeader = make(chan leader, 1)
		go func() {
			st, err := k.leaderGet(ctx, fenceKey)
			if !st.Live {
				st.Rev = 0 // not there to be found
			}
			atLeader <- leader{st.Rev, err}
		}()
	}
	wait := 5 * time.Millisecond
	for {
		entries, err := k.Prefix(ctx, prefix, 0)
		if err != nil {
			return nil, err
		}
		if atLeader != nil {
			l := <-atLeader
			if l.err != nil {
				return nil, l.err
			}
			minRev, atLeader = max(minRev, l.rev), nil
		}
		i := slices.IndexFunc(entries, func(e Entry) bool { return e.Key == fenceKey })
		if minRev == 0 || i >= 0 && entries[i].Rev >= minRev {
			return entries, nil
		}
		select {
		case <-ctx.Done():
			return nil, Unavailable(fmt.Errorf("jetflow: read %s/%s.*: no replica answered with revision %d of %s: %w", k.Bucket(), prefix, minRev, fenceKey, ctx.Err()))
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// ErrTooManyKeys: a batch read (Last) matched more keys than the server
// answers at once (1,024), and it answered none of them.
var ErrTooManyKeys = errors.New("jetflow: more keys than one read returns")

// Last reads the latest value of each of keys in one direct get, in
// revision order; a key without one (never written, or deleted) is left
// out. A key may be a filter with wildcards ("live.>"): every key it
// matches is read. When the keys match more than the server answers at
// once (1,024, markers included), nothing is returned and the error
// matches ErrTooManyKeys.
func (k *KV) Last(ctx context.Context, keys ...string) ([]Entry, error) {
	subjects := make([]string, len(keys))
	for i, key := range keys {
		subjects[i] = k.prefix + key
	}
	msgs, status, err := k.direct.request(ctx, "KV_"+k.Bucket(), DirectRequest{MultiLastFor: subjects})
	if err == nil && status == "413" {
		err = ErrTooManyKeys
	}
	if err != nil {
		return nil, fmt.Errorf("jetflow: read %s/%s: %w", k.Bucket(), strings.Join(keys, ","), err)
	}
	return k.entries(msgs), nil
}

// entries are the keys msgs hold, each at its latest message among them,
// in revision order; a key whose latest message is a delete, purge or
// expiry marker is left out.
func (k *KV) entries(msgs []*nats.Msg) []Entry {
	latest := make(map[string]*nats.Msg, len(msgs))
	for _, m := range msgs {
		key := strings.TrimPrefix(m.Header.Get(natsjs.SubjectHeader), k.prefix)
		if old, ok := latest[key]; !ok || msgSeq(old) < msgSeq(m) {
			latest[key] = m
		}
	}
	out := make([]Entry, 0, len(latest))
	for key, m := range latest {
		if m.Header.Get("KV-Operation") != "" || m.Header.Get(natsjs.MarkerReasonHeader) != "" {
			continue
		}
		out = append(out, Entry{Key: key, Value: m.Data, Rev: msgSeq(m)})
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Rev, b.Rev) })
	return out
}

// msgSeq is the stream sequence of a direct get's answer (0 when it has
// none).
func msgSeq(m *nats.Msg) uint64 {
	seq, _ := strconv.ParseUint(m.Header.Get(natsjs.SequenceHeader), 10, 64)
	return seq
}
