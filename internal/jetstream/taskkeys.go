package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TaskKeysBucket holds task idempotency keys (G7): per key, the claim of the
// step producing its result, then the result. Every write carries a
// per-message TTL (the claim's lease, then the key's TTL), so a key
// disappears only when its TTL passes or it is reset; there is no sweeper.
const TaskKeysBucket = "jetflow_taskkeys"

// TaskKeyMarkerTTL is how long the marker left by an expired, released or
// reset key stays (the bucket's LimitMarkerTTL). Watchers see the marker at
// once; it only has to outlive the watch deliveries.
const TaskKeyMarkerTTL = time.Minute

// WholeSeconds rounds d up to whole seconds, at least one: JetStream keeps
// message TTLs in whole seconds (it truncates) and refuses less than 1s.
func WholeSeconds(d time.Duration) time.Duration {
	s := d.Truncate(time.Second)
	if s < d {
		s += time.Second
	}
	return max(s, time.Second)
}

// TaskKeys is the task-keys bucket, provisioned on first use: a deployment
// that never uses task keys never needs it (nor the permissions for it).
type TaskKeys struct {
	js  natsjs.JetStream
	p   provisioner // Provision's
	cfg natsjs.KeyValueConfig

	mu     sync.Mutex
	kv     *KV
	stream natsjs.Stream
}

func newTaskKeys(p provisioner, topo Topology, storage natsjs.StorageType) *TaskKeys {
	return &TaskKeys{js: p.js, p: p, cfg: natsjs.KeyValueConfig{
		Bucket:         TaskKeysBucket,
		Description:    "jetflow task idempotency keys: claims and cached step results, per-key TTL",
		History:        1,
		LimitMarkerTTL: TaskKeyMarkerTTL,
		Storage:        storage,
		Replicas:       topo.Replicas,
	}}
}

// Bind provisions the bucket (once per process, in the mode of Provision)
// and returns it.
func (t *TaskKeys) Bind(ctx context.Context) (*KV, error) {
	kv, _, err := t.bind(ctx)
	return kv, err
}

func (t *TaskKeys) bind(ctx context.Context) (*KV, natsjs.Stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.kv != nil {
		return t.kv, t.stream, nil
	}
	kv, err := t.p.ensureBucket(ctx, t.cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("jetflow: provision bucket %s: %w", TaskKeysBucket, err)
	}
	if kv.Bucket() != TaskKeysBucket {
		return nil, nil, fmt.Errorf("jetflow: bucket %s bound as %s", TaskKeysBucket, kv.Bucket())
	}
	st, err := t.js.Stream(ctx, "KV_"+TaskKeysBucket)
	if err != nil {
		return nil, nil, fmt.Errorf("jetflow: bind bucket %s: %w", TaskKeysBucket, err)
	}
	if st.CachedInfo().Config.SubjectDeleteMarkerTTL <= 0 || !st.CachedInfo().Config.AllowMsgTTL {
		return nil, nil, fmt.Errorf("jetflow: bucket %s has no per-key TTL (LimitMarkerTTL): recreate it", TaskKeysBucket)
	}
	t.kv, t.stream = newKV(t.js, kv, t.cfg.Replicas, newDirectMux(t.js.Conn())), st
	return t.kv, t.stream, nil
}

// Latest reads the last message of key, markers included, so that a
// create-if-absent after expiry can compare-and-set against the marker.
func (t *TaskKeys) Latest(ctx context.Context, key string) (KeyState, error) {
	kv, _, err := t.bind(ctx)
	if err != nil {
		return KeyState{}, err
	}
	return kv.Latest(ctx, key)
}

// Create writes value under key with a TTL if the key holds no value: it
// has never been written, or its last message is the marker rev (from
// Latest; 0 when there is none) left by an expiry, a release or a reset. It
// returns the new revision, or ErrExists.
func (t *TaskKeys) Create(ctx context.Context, key string, value []byte, marker uint64, ttl time.Duration) (uint64, error) {
	kv, _, err := t.bind(ctx)
	if err != nil {
		return 0, err
	}
	if marker == 0 {
		return kv.CreateTTL(ctx, key, value, ttl)
	}
	rev, err := kv.UpdateTTL(ctx, key, value, marker, ttl)
	if errors.Is(err, ErrRevisionMismatch) {
		return 0, fmt.Errorf("%w: %s/%s", ErrExists, TaskKeysBucket, key)
	}
	return rev, err
}

// Replace writes value under key with a TTL if the key's last revision is
// rev, or returns ErrRevisionMismatch.
func (t *TaskKeys) Replace(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration) (uint64, error) {
	kv, _, err := t.bind(ctx)
	if err != nil {
		return 0, err
	}
	return kv.UpdateTTL(ctx, key, value, rev, ttl)
}

// Release removes key if its last revision is still rev (a claim given up),
// leaving a marker that expires after TaskKeyMarkerTTL. It returns
// ErrRevisionMismatch when the key has changed since.
func (t *TaskKeys) Release(ctx context.Context, key string, rev uint64) error {
	kv, _, err := t.bind(ctx)
	if err != nil {
		return err
	}
	err = kv.kv.Purge(ctx, key, natsjs.LastRevision(rev), natsjs.PurgeTTL(TaskKeyMarkerTTL))
	if IsWrongLastSequence(err) {
		return fmt.Errorf("%w: %s/%s at revision %d", ErrRevisionMismatch, TaskKeysBucket, key, rev)
	}
	if err != nil {
		return fmt.Errorf("jetflow: release %s/%s: %w", TaskKeysBucket, key, err)
	}
	return nil
}

// Keys lists the keys matching filter that hold a value (not a marker).
// Before the bucket exists (no keyed step ever ran) there are none: it
// returns nil without creating the bucket, so a user that may not create
// it can still reset keys.
func (t *TaskKeys) Keys(ctx context.Context, filter string) ([]string, error) {
	t.mu.Lock()
	bound := t.kv != nil
	t.mu.Unlock()
	if !bound {
		if _, err := t.js.Stream(ctx, "KV_"+TaskKeysBucket); errors.Is(err, natsjs.ErrStreamNotFound) {
			return nil, nil
		}
	}
	kv, _, err := t.bind(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("jetflow: list %s/%s: %w", TaskKeysBucket, filter, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil { // the listing stops early when ctx ends
		return nil, err
	}
	return keys, nil
}

// Watch delivers the changes of key from now on (values and markers).
func (t *TaskKeys) Watch(ctx context.Context, key string) (natsjs.KeyWatcher, error) {
	kv, _, err := t.bind(ctx)
	if err != nil {
		return nil, err
	}
	w, err := kv.kv.Watch(ctx, key, natsjs.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("jetflow: watch %s/%s: %w", TaskKeysBucket, key, err)
	}
	return w, nil
}
