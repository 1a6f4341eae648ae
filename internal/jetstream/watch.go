package jetstream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// HeaderEntry is an entry of WatchHeaders: a key's write with the
// message's headers, and no value.
type HeaderEntry interface {
	natsjs.KeyValueEntry
	Header() nats.Header
}

// WatchHeaders watches the writes to every key of the bucket stored after
// revision after (every write when after is 0), in revision order, with
// their headers and without their values: a small message per write, that
// says which key was written at which revision, and what the writer put
// in its headers. Like natsjs's watchers, it sends nil once it has caught
// up with the writes stored when it began. Stop ends it.
func (k *KV) WatchHeaders(ctx context.Context, after uint64) (natsjs.KeyWatcher, error) {
	cfg := natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{k.prefix + ">"}, HeadersOnly: true,
		DeliverPolicy: natsjs.DeliverAllPolicy, InactiveThreshold: 30 * time.Second,
	}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, after+1
	}
	cons, err := k.js.OrderedConsumer(ctx, "KV_"+k.Bucket(), cfg)
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	w := &headerWatcher{it: it, updates: make(chan natsjs.KeyValueEntry, 256), stop: make(chan struct{}),
		remove: func() {
			// Its consumer goes with it, not an inactivity later.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = k.js.DeleteConsumer(ctx, "KV_"+k.Bucket(), cons.CachedInfo().Name)
		}}
	caughtUp := cons.CachedInfo().NumPending == 0
	go w.run(k, caughtUp)
	return w, nil
}

type headerWatcher struct {
	it      natsjs.MessagesContext
	remove  func()
	updates chan natsjs.KeyValueEntry
	stop    chan struct{}
	once    sync.Once
}

func (w *headerWatcher) Updates() <-chan natsjs.KeyValueEntry { return w.updates }

// Stop ends the watch; its updates channel is closed once its last entry
// was taken.
func (w *headerWatcher) Stop() error {
	w.once.Do(func() {
		close(w.stop)
		w.it.Stop()
		go w.remove()
	})
	return nil
}

func (w *headerWatcher) run(k *KV, caughtUp bool) {
	defer close(w.updates)
	send := func(e natsjs.KeyValueEntry) bool {
		select {
		case w.updates <- e:
			return true
		case <-w.stop:
			return false
		}
	}
	if caughtUp && !send(nil) {
		return
	}
	for {
		m, err := w.it.Next()
		if err != nil {
			if !errors.Is(err, natsjs.ErrMsgIteratorClosed) {
				w.it.Stop()
			}
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		e := headerEntry{bucket: k.Bucket(), key: strings.TrimPrefix(m.Subject(), k.prefix), rev: md.Sequence.Stream,
			created: md.Timestamp, delta: md.NumPending, hdr: m.Headers()}
		if !send(e) || md.NumPending == 0 && !send(nil) {
			return
		}
	}
}

type headerEntry struct {
	bucket, key string
	rev, delta  uint64
	created     time.Time
	hdr         nats.Header
}

func (e headerEntry) Bucket() string      { return e.bucket }
func (e headerEntry) Key() string         { return e.key }
func (e headerEntry) Value() []byte       { return nil }
func (e headerEntry) Revision() uint64    { return e.rev }
func (e headerEntry) Created() time.Time  { return e.created }
func (e headerEntry) Delta() uint64       { return e.delta }
func (e headerEntry) Header() nats.Header { return e.hdr }
func (e headerEntry) Operation() natsjs.KeyValueOp {
	switch e.hdr.Get("KV-Operation") {
	case "DEL":
		return natsjs.KeyValueDelete
	case "PURGE":
		return natsjs.KeyValuePurge
	}
	if e.hdr.Get(natsjs.MarkerReasonHeader) != "" {
		return natsjs.KeyValuePurge
	}
	return natsjs.KeyValuePut
}
