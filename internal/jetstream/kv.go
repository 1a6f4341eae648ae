package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Errors of the KV helpers. They are the only place raw JetStream error
// codes are interpreted.
var (
	// ErrExists: a create-if-absent found the key already written.
	ErrExists = errors.New("jetflow: key already exists")
	// ErrRevisionMismatch: a compare-and-set found a newer revision.
	ErrRevisionMismatch = errors.New("jetflow: revision mismatch")
	// ErrNotFound: the key has no value.
	ErrNotFound = errors.New("jetflow: key not found")
	// ErrFenced: a fenced write found its fence key written since the
	// revision it holds (PutFenced).
	ErrFenced = errors.New("jetflow: fence key moved")
)

// KV wraps one bucket with the compare-and-set operations jetflow relies on.
type KV struct {
	js     natsjs.JetStream
	kv     natsjs.KeyValue
	prefix string

	// replicated buckets are read from the stream leader: a direct get
	// may be answered by a lagging follower, and jetflow decides with its
	// reads (is this step committed? whose record is this?).
	replicated bool

	// direct answers batch reads (Prefix).
	direct *directMux

	mu     sync.Mutex
	stream natsjs.Stream // bound on first use (bind)
}

func newKV(js natsjs.JetStream, kv natsjs.KeyValue, replicas int, direct *directMux) *KV {
	return &KV{js: js, kv: kv, prefix: "$KV." + kv.Bucket() + ".", replicated: replicas > 1, direct: direct}
}

// Bucket is the bucket's name.
func (k *KV) Bucket() string { return k.kv.Bucket() }

// Replicated reports whether the bucket has replicas: then a batch read
// (Prefix, Last) may be answered by a replica that lags behind its
// leader, and only Get, Latest and PrefixFenced read what the leader has.
func (k *KV) Replicated() bool { return k.replicated }

// Raw is the underlying nats.go handle, for watches and listings.
func (k *KV) Raw() natsjs.KeyValue { return k.kv }

// Create writes value under key only if the key has never been written (or
// has expired). It returns the new revision, or ErrExists. Unlike
// natsjs.KeyValue.Create it costs one round trip on conflict: jetflow never
// deletes keys, so there is no delete marker to overwrite.
//
// Create is not retry-safe by itself: after a lost reply a retry sees
// ErrExists for its own write. Callers put a writer token in the value and
// compare it (see dedupe).
func (k *KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.put(ctx, key, value, 0, 0)
}

// TTLNever, as the TTL of a write, exempts the message from expiry: it is
// sent with the header "Nats-TTL: never", which the server stores as a TTL
// of -1 and also exempts from the bucket's MaxAge. The key is kept until it
// is written again.
const TTLNever time.Duration = -1

// CreateTTL is Create with a per-message TTL (whole seconds, rounded up, at
// least 1s; or TTLNever): the key expires ttl after this write. The bucket
// needs LimitMarkerTTL. Like Create it fails with ErrExists when the key's
// last message is a delete or expiry marker (see TaskKeys.Create).
func (k *KV) CreateTTL(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error) {
	return k.put(ctx, key, value, 0, ttl)
}

// UpdateTTL is Update with a per-message TTL: the key now expires ttl after
// this write (never with TTLNever). rev may be a marker's revision, to
// recreate an expired key.
func (k *KV) UpdateTTL(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration) (uint64, error) {
	if rev == 0 {
		return 0, fmt.Errorf("jetflow: update %s/%s: revision 0 is a create", k.Bucket(), key)
	}
	return k.put(ctx, key, value, rev, ttl)
}

// UpdateTTLHeader is UpdateTTL with extra headers on the message, which a
// watch of headers (WatchHeaders) delivers without the value.
func (k *KV) UpdateTTLHeader(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration, hdr nats.Header) (uint64, error) {
	if rev == 0 {
		return 0, fmt.Errorf("jetflow: update %s/%s: revision 0 is a create", k.Bucket(), key)
	}
	return k.put(ctx, key, value, rev, ttl, hdr)
}

// Update writes value under key only if the key's latest revision is rev.
// It returns the new revision, or ErrRevisionMismatch.
func (k *KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if rev == 0 {
		return 0, fmt.Errorf("jetflow: update %s/%s: revision 0 is a create", k.Bucket(), key)
	}
	return k.put(ctx, key, value, rev, 0)
}

// put writes with compare-and-set on the key's last revision (0: none) and
// a per-message TTL: rounded up to whole seconds when ttl > 0, "never" with
// TTLNever, none (the bucket's MaxAge) when ttl is 0.
func (k *KV) put(ctx context.Context, key string, value []byte, rev uint64, ttl time.Duration, hdr ...nats.Header) (uint64, error) {
	msg := &nats.Msg{Subject: k.prefix + key, Data: value, Header: nats.Header{}}
	for _, h := range hdr {
		for name, vs := range h {
			msg.Header[name] = vs
		}
	}
	opts := []natsjs.PublishOpt{natsjs.WithExpectLastSequencePerSubject(rev)}
	switch {
	case ttl == TTLNever:
		msg.Header.Set(natsjs.MsgTTLHeader, "never")
	case ttl > 0:
		opts = append(opts, natsjs.WithMsgTTL(WholeSeconds(ttl)))
	case ttl < 0:
		return 0, fmt.Errorf("jetflow: write %s/%s: negative TTL %s (TTLNever is the only one)", k.Bucket(), key, ttl)
	}
	ack, err := k.js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		if IsWrongLastSequence(err) {
			if rev == 0 {
				return 0, fmt.Errorf("%w: %s/%s", ErrExists, k.Bucket(), key)
			}
			return 0, fmt.Errorf("%w: %s/%s at revision %d", ErrRevisionMismatch, k.Bucket(), key, rev)
		}
		return 0, fmt.Errorf("jetflow: write %s/%s: %w", k.Bucket(), key, err)
	}
	return ack.Sequence, nil
}

// PutFenced writes value under key only if fenceKey's latest revision is
// fenceRev (0: fenceKey was never written), in one message: the server
// checks the fence and stores the value as one step, also while other
// writes are in flight on a replicated bucket. It returns the new revision,
// or ErrFenced when fenceKey was written since fenceRev. key itself is not
// checked: the writer must know what it holds (see internal/workflow's
// lease).
func (k *KV) PutFenced(ctx context.Context, key string, value []byte, fenceKey string, fenceRev uint64) (uint64, error) {
	msg := &nats.Msg{Subject: k.prefix + key, Data: value, Header: nats.Header{}}
	ack, err := k.js.PublishMsg(ctx, msg, natsjs.WithExpectLastSequenceForSubject(fenceRev, k.prefix+fenceKey))
	if err != nil {
		if IsWrongLastSequence(err) {
			return 0, fmt.Errorf("%w: %s/%s (writing %s at fence revision %d)", ErrFenced, k.Bucket(), fenceKey, key, fenceRev)
		}
		return 0, fmt.Errorf("jetflow: write %s/%s: %w", k.Bucket(), key, err)
	}
	return ack.Sequence, nil
}

// Put writes value under key whatever it held before.
func (k *KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	ack, err := k.js.PublishMsg(ctx, &nats.Msg{Subject: k.prefix + key, Data: value})
	if err != nil {
		return 0, fmt.Errorf("jetflow: write %s/%s: %w", k.Bucket(), key, err)
	}
	return ack.Sequence, nil
}

// Get returns the latest value and revision of key, or ErrNotFound. On a
// replicated bucket it asks the stream leader, so that a value whose write
// was acknowledged is never reported absent.
func (k *KV) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	if k.replicated {
		st, err := k.leaderGet(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		if !st.Live {
			return nil, 0, fmt.Errorf("%w: %s/%s", ErrNotFound, k.Bucket(), key)
		}
		return st.Value, st.Rev, nil
	}
	e, err := k.kv.Get(ctx, key)
	if errors.Is(err, natsjs.ErrKeyNotFound) || errors.Is(err, natsjs.ErrKeyDeleted) {
		return nil, 0, fmt.Errorf("%w: %s/%s", ErrNotFound, k.Bucket(), key)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("jetflow: read %s/%s: %w", k.Bucket(), key, err)
	}
	return e.Value(), e.Revision(), nil
}

// KeyState is the last message stored for a key.
type KeyState struct {
	Value []byte
	// Rev is the message's revision: the value's, or the marker's when the
	// key was deleted, purged or expired; 0 when the key has no message.
	Rev uint64
	// Live is true when Value is a value (not a marker).
	Live bool
	// Time is when the server stored the message (by the server's clock):
	// for an expiry marker, when the key expired.
	Time time.Time
}

// Latest reads the last message of key, markers included: on a bucket with
// LimitMarkerTTL an expired key leaves a marker, which tells "never
// written" from "written and expired", and against which a create-if-absent
// after expiry compares.
func (k *KV) Latest(ctx context.Context, key string) (KeyState, error) {
	if k.replicated {
		return k.leaderGet(ctx, key)
	}
	st, err := k.bind(ctx)
	if err != nil {
		return KeyState{}, err
	}
	m, err := st.GetLastMsgForSubject(ctx, k.prefix+key)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return KeyState{}, nil
	}
	if err != nil {
		return KeyState{}, fmt.Errorf("jetflow: read %s/%s: %w", k.Bucket(), key, err)
	}
	live := m.Header.Get("KV-Operation") == "" && m.Header.Get(natsjs.MarkerReasonHeader) == ""
	return KeyState{Value: m.Data, Rev: m.Sequence, Live: live, Time: m.Time}, nil
}

// Purge removes the keys filter matches (a key, or a filter with
// wildcards such as "run-1.>"), every message of each: a stream purge,
// which leaves no marker, so a create-if-absent of such a key succeeds
// again. upTo > 0 removes only the messages at or before that revision:
// a key written again after it keeps its newer value. It returns how many
// messages it removed; a filter that matches none is not an error.
func (k *KV) Purge(ctx context.Context, filter string, upTo uint64) (uint64, error) {
	req := struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq,omitempty"`
	}{Filter: k.prefix + filter}
	if upTo > 0 {
		req.Seq = upTo + 1 // the server purges below Seq
	}
	b, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	m, err := k.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.PURGE.KV_"+k.Bucket(), b)
	if err != nil {
		return 0, fmt.Errorf("jetflow: purge %s/%s: %w", k.Bucket(), filter, err)
	}
	var resp struct {
		Error  *natsjs.APIError `json:"error,omitempty"`
		Purged uint64           `json:"purged"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, fmt.Errorf("jetflow: purge %s/%s: %w", k.Bucket(), filter, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("jetflow: purge %s/%s: %w", k.Bucket(), filter, resp.Error)
	}
	return resp.Purged, nil
}

// bind returns the bucket's stream, bound on first use.
func (k *KV) bind(ctx context.Context) (natsjs.Stream, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stream == nil {
		st, err := k.js.Stream(ctx, "KV_"+k.Bucket())
		if err != nil {
			return nil, fmt.Errorf("jetflow: bind bucket %s: %w", k.Bucket(), err)
		}
		k.stream = st
	}
	return k.stream, nil
}

// leaderGet reads the last message of key from the bucket stream's leader
// ($JS.API.STREAM.MSG.GET, which only the leader answers), markers included.
func (k *KV) leaderGet(ctx context.Context, key string) (KeyState, error) {
	st, err := leaderLast(ctx, k.js.Conn(), "KV_"+k.Bucket(), k.prefix+key)
	if err != nil {
		return KeyState{}, fmt.Errorf("jetflow: read %s/%s: %w", k.Bucket(), key, err)
	}
	return st, nil
}

// leaderLast reads the last message of subject in stream from the stream's
// leader ($JS.API.STREAM.MSG.GET, which only the leader answers), markers
// included; a subject without one is the zero KeyState.
func leaderLast(ctx context.Context, nc *nats.Conn, stream, subject string) (KeyState, error) {
	m, err := leaderMsg(ctx, nc, stream, struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	return m.KeyState, err
}

// storedMsg is a message of a stream as its leader returned it.
type storedMsg struct {
	KeyState
	Subject string
}

// leaderMsg asks stream's leader for the message req names (by sequence,
// or the last of a subject); a message that is not there is the zero
// storedMsg.
func leaderMsg(ctx context.Context, nc *nats.Conn, stream string, req any) (storedMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	b, err := json.Marshal(req)
	if err != nil {
		return storedMsg{}, err
	}
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, b)
	if err != nil {
		return storedMsg{}, err
	}
	var resp struct {
		Error   *natsjs.APIError `json:"error,omitempty"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs,omitempty"`
			Data    []byte    `json:"data,omitempty"`
			Time    time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return storedMsg{}, err
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == natsjs.JSErrCodeMessageNotFound {
			return storedMsg{}, nil
		}
		return storedMsg{}, resp.Error
	}
	if resp.Message == nil {
		return storedMsg{}, errors.New("empty answer")
	}
	live := true
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return storedMsg{}, err
		}
		live = h.Get("KV-Operation") == "" && h.Get(natsjs.MarkerReasonHeader) == ""
	}
	return storedMsg{
		KeyState: KeyState{Value: resp.Message.Data, Rev: resp.Message.Seq, Live: live, Time: resp.Message.Time},
		Subject:  resp.Message.Subject,
	}, nil
}

// GetExisting reads a key that a compare-and-set has just reported as
// written. A read served by a lagging replica can still miss it, so a miss
// is retried until ctx or a 5s bound ends; the key is never reported absent.
func (k *KV) GetExisting(ctx context.Context, key string) ([]byte, uint64, error) {
	deadline := time.Now().Add(5 * time.Second)
	wait := 5 * time.Millisecond
	for {
		v, rev, err := k.Get(ctx, key)
		if !errors.Is(err, ErrNotFound) {
			return v, rev, err
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("jetflow: %s/%s exists but cannot be read: %w", k.Bucket(), key, err)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// IsWrongLastSequence reports whether err is JetStream's compare-and-set
// conflict: 10071 on a single replica, 10164 on a replicated stream.
func IsWrongLastSequence(err error) bool {
	var apiErr *natsjs.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant
}

// IsAPIError reports whether err is an answer from JetStream (as opposed to
// a timeout or a connection error, after which the request may or may not
// have been applied).
func IsAPIError(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr)
}

// errCodeStoreFailed is JSStreamStoreFailedF; with the text below it means
// the per-subject limit refused the message.
const errCodeStoreFailed natsjs.ErrorCode = 10077

// errCodeMsgIDInProcess is "duplicate message id is in process": on a
// replicated stream a duplicate arrived while the original is still being
// replicated. Retrying resolves it.
const errCodeMsgIDInProcess natsjs.ErrorCode = 10158

func isPerSubjectLimit(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStoreFailed &&
		strings.Contains(apiErr.Description, "maximum messages per subject")
}

func isMsgIDInProcess(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMsgIDInProcess
}
