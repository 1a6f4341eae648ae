// Package roster records which workflows a jetflow deployment knows and
// which workers serve them now, in the bucket jetflow_workflows
// (jetstream.WorkflowsBucket), so that a start nobody answers can be told
// apart: a workflow this deployment has never heard of (a client's typo:
// "unknown workflow") from a known workflow whose workers are all down or
// restarting ("retry later").
//
// Two kinds of record, both written by workers only:
//
//   - known.<workflow>: written once, create-if-absent, by the first worker
//     that serves the workflow, and never changed or expired: who served it
//     first and when (Known).
//   - live.<workflow>.<worker-id>: one per serving worker, rewritten by its
//     heartbeat every third of the liveness TTL with a per-message TTL
//     (Nats-TTL), so that it expires on its own once the worker is gone,
//     however it went; Stop withdraws it at once (Live).
//
// Producers only read: after a start nobody answered, the workflow's known
// record and whether any worker of the deployment is live now, in one
// request (Read). A name no worker ever served is "unknown" only while
// some worker is live: with none (a fresh deployment whose workers have
// not reported yet, or all of them down) nothing tells a typo from a
// workflow whose workers are still to come, and the start is to be
// retried.
package roster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/state"
)

// Known is the permanent record of a workflow the deployment has served.
type Known struct {
	Workflow string `json:"workflow"`
	// FirstWorker is the name of the worker that first served it.
	FirstWorker string `json:"first_worker"`
	// FirstServed is when that worker started serving it.
	FirstServed time.Time `json:"first_served"`
}

// Live is the liveness record of one worker serving one workflow.
type Live struct {
	Workflow string `json:"workflow"`
	Worker   string `json:"worker"`
	// Since is when the worker started serving the workflow; Beat is its
	// latest heartbeat.
	Since time.Time `json:"since"`
	Beat  time.Time `json:"beat"`
	// Protocol is the engine protocol the worker speaks
	// (state.EngineProtocol; 0 in records of workers before protocol 3),
	// Build its code's build identity, TTL its liveness TTL (0 in records
	// that predate them).
	Protocol int           `json:"protocol,omitempty"`
	Build    string        `json:"build,omitempty"`
	TTL      time.Duration `json:"ttl,omitempty"`
}

// legacyTTL is how long after its last heartbeat a liveness record without
// a TTL (a worker before protocol 3) is taken for a live worker's, whatever
// the bucket holds: such workers rewrite it every LivenessTTL/3 (15s by
// default).
const legacyTTL = 2 * time.Minute

// Alive reports whether l, a record the bucket holds, is a live worker's at
// now: its last heartbeat is within two of its TTLs (legacyTTL for a record
// without one). The bucket expires a record one TTL after its heartbeat,
// but a removal can be undone by an unclean stop of the server: the time
// in the record decides.
func (l Live) Alive(now time.Time) bool {
	ttl := legacyTTL
	if l.TTL > 0 {
		ttl = 2 * l.TTL
	}
	return now.Sub(l.Beat) < ttl
}

// KnownKey is the key of workflow's permanent record.
func KnownKey(workflow string) string { return "known." + workflow }

// LiveKey is the key of the liveness record of the worker with id serving
// workflow.
func LiveKey(workflow, id string) string { return "live." + workflow + "." + id }

// Lookup reads workflow's permanent record. found is false when no worker
// has ever served the workflow; err is set only when the bucket could not
// be read, and then found says nothing.
func Lookup(ctx context.Context, kv *jetstream.KV, workflow string) (k Known, found bool, err error) {
	v, _, err := kv.Get(ctx, KnownKey(workflow))
	if errors.Is(err, jetstream.ErrNotFound) {
		return Known{}, false, nil
	}
	if err != nil {
		return Known{}, false, err
	}
	if err := json.Unmarshal(v, &k); err != nil {
		return Known{}, false, fmt.Errorf("jetflow: record %s/%s: %w", kv.Bucket(), KnownKey(workflow), err)
	}
	return k, true, nil
}

// Status is what the roster says of a workflow that no worker answered.
type Status struct {
	// Known is the workflow's permanent record, when Found.
	Known Known
	// Found: a worker has served the workflow; none serves it now.
	Found bool
	// Live is the number of liveness records of the deployment, of any
	// workflow: 0 when no worker runs now (none has reported yet, or all
	// are gone).
	Live int
}

// Read reads workflow's permanent record and the liveness records of the
// whole deployment in one direct get. A record absent on a replica that
// lags may be present on the stream leader: on a replicated bucket, an
// answer that would make the name unknown (not found, some worker live)
// is checked against the leader's known record (Lookup) first. With more
// liveness records than one read returns, they are read in pages. err is
// set only when the bucket could not be read, and then Status says
// nothing.
func Read(ctx context.Context, kv *jetstream.KV, workflow string, now time.Time) (Status, error) {
	entries, err := kv.Last(ctx, KnownKey(workflow), "live.>")
	if errors.Is(err, jetstream.ErrTooManyKeys) {
		return readPaged(ctx, kv, workflow, now)
	}
	if err != nil {
		return Status{}, err
	}
	var s Status
	for _, e := range entries {
		if e.Key != KnownKey(workflow) {
			l, err := decodeLive(kv, e)
			if err != nil {
				return Status{}, err
			}
			if l.Alive(now) {
				s.Live++
			}
			continue
		}
		if err := json.Unmarshal(e.Value, &s.Known); err != nil {
			return Status{}, fmt.Errorf("jetflow: record %s/%s: %w", kv.Bucket(), e.Key, err)
		}
		s.Found = true
	}
	if !s.Found && s.Live > 0 && kv.Replicated() {
		s.Known, s.Found, err = Lookup(ctx, kv, workflow)
		if err != nil {
			return Status{}, err
		}
	}
	return s, nil
}

// readPaged is Read for a deployment with more liveness records (and
// markers of withdrawn ones) than one direct get returns.
func readPaged(ctx context.Context, kv *jetstream.KV, workflow string, now time.Time) (Status, error) {
	k, found, err := Lookup(ctx, kv, workflow)
	if err != nil {
		return Status{}, err
	}
	live, err := Current(ctx, kv, now)
	if err != nil {
		return Status{}, err
	}
	return Status{Known: k, Found: found, Live: len(live)}, nil
}

// decodeLive decodes the liveness record e.
func decodeLive(kv *jetstream.KV, e jetstream.Entry) (Live, error) {
	var l Live
	if err := json.Unmarshal(e.Value, &l); err != nil {
		return Live{}, fmt.Errorf("jetflow: record %s/%s: %w", kv.Bucket(), e.Key, err)
	}
	return l, nil
}

// Presented is a liveness record as List reads it: the record, and the ID
// of the worker's presence that wrote it (the last token of its key, new
// at each start of a worker).
type Presented struct {
	Live
	ID string
}

// List reads every known record and the liveness records of the live
// workers of the deployment (Current at now): two reads of the bucket, each
// a snapshot (in pages beyond 1,024 keys); a record withdrawn, expired or
// past its time is left out. A record that does not decode is an error, as
// is a bucket that cannot be read.
func List(ctx context.Context, kv *jetstream.KV, now time.Time) ([]Known, []Presented, error) {
	known, err := kv.Prefix(ctx, "known", 0)
	if err != nil {
		return nil, nil, err
	}
	live, err := Current(ctx, kv, now)
	if err != nil {
		return nil, nil, err
	}
	ks := make([]Known, 0, len(known))
	for _, e := range known {
		var k Known
		if err := json.Unmarshal(e.Value, &k); err != nil {
			return nil, nil, fmt.Errorf("jetflow: record %s/%s: %w", kv.Bucket(), e.Key, err)
		}
		ks = append(ks, k)
	}
	return ks, live, nil
}

// Current lists the liveness records of the live workers of the
// deployment (Alive at now): one read of every liveness record; an error
// says the bucket could not be read.
func Current(ctx context.Context, kv *jetstream.KV, now time.Time) ([]Presented, error) {
	live, err := kv.Prefix(ctx, "live", 0)
	if err != nil {
		return nil, err
	}
	out := []Presented{}
	for _, e := range live {
		l, err := decodeLive(kv, e)
		if err != nil {
			return nil, err
		}
		if l.Alive(now) {
			out = append(out, Presented{Live: l, ID: e.Key[strings.LastIndexByte(e.Key, '.')+1:]})
		}
	}
	return out, nil
}

// MinTTL is the shortest liveness TTL: JetStream keeps per-message TTLs in
// whole seconds.
const MinTTL = time.Second

// Presence is a started worker's announcement: its liveness records,
// refreshed until Stop.
type Presence struct {
	kv     *jetstream.KV
	worker string
	build  string
	ttl    time.Duration
	log    zerolog.Logger
	since  time.Time

	mu   sync.Mutex
	revs map[string]uint64 // workflow -> revision of its last liveness write
	id   string

	stop chan struct{}
	done chan struct{}
}

// Announce records that the worker called worker, of build build, serves
// workflows: a permanent known record for each workflow that has none, and
// a liveness record of this worker for each (with its engine protocol,
// state.EngineProtocol), with TTL ttl (whole seconds, at least MinTTL). A
// goroutine rewrites the liveness records every ttl/3 until Stop; a failed
// heartbeat is logged and tried again at the next tick. The records are
// written before Announce returns; an error means some were not, and
// nothing keeps running.
func Announce(ctx context.Context, kv *jetstream.KV, workflows []string, worker, build string, ttl time.Duration, log zerolog.Logger) (*Presence, error) {
	if ttl < MinTTL {
		return nil, fmt.Errorf("jetflow: liveness TTL must be at least %s, got %s", MinTTL, ttl)
	}
	p := &Presence{
		kv: kv, worker: worker, build: build, ttl: jetstream.WholeSeconds(ttl), log: log, since: time.Now().UTC(),
		revs: make(map[string]uint64, len(workflows)), id: nuid.Next(),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	for _, wf := range workflows {
		if err := p.markKnown(ctx, wf); err != nil {
			return nil, err
		}
		p.revs[wf] = 0
	}
	if err := p.beat(ctx); err != nil {
		return nil, err
	}
	go p.run()
	return p, nil
}

// Since is when the worker started serving its workflows: its liveness
// records' Since.
func (p *Presence) Since() time.Time { return p.since }

// markKnown creates workflow's permanent record unless it exists: the
// first worker to serve a workflow names it; later ones find it.
func (p *Presence) markKnown(ctx context.Context, workflow string) error {
	v, err := json.Marshal(Known{Workflow: workflow, FirstWorker: p.worker, FirstServed: p.since})
	if err != nil {
		return err
	}
	_, err = p.kv.Create(ctx, KnownKey(workflow), v)
	if err != nil && !errors.Is(err, jetstream.ErrExists) {
		return fmt.Errorf("jetflow: record workflow %s as known: %w", workflow, err)
	}
	return nil
}

// beat rewrites every liveness record of the worker, each with a fresh TTL.
func (p *Presence) beat(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now().UTC()
	var errs []error
	for wf, rev := range p.revs {
		v, err := json.Marshal(Live{Workflow: wf, Worker: p.worker, Since: p.since, Beat: now,
			Protocol: state.EngineProtocol, Build: p.build, TTL: p.ttl})
		if err != nil {
			return err
		}
		rev, err = p.write(ctx, LiveKey(wf, p.id), v, rev)
		if err != nil {
			errs = append(errs, fmt.Errorf("jetflow: liveness of %s: %w", wf, err))
			continue
		}
		p.revs[wf] = rev
	}
	return errors.Join(errs...)
}

// write stores v under key with the presence's TTL, by compare-and-set on
// rev, the revision of the worker's own last write. When the key moved on
// without it (the record expired during a stall and left a marker), it
// writes over the key's latest message.
func (p *Presence) write(ctx context.Context, key string, v []byte, rev uint64) (uint64, error) {
	put := func(rev uint64) (uint64, error) {
		if rev == 0 {
			return p.kv.CreateTTL(ctx, key, v, p.ttl)
		}
		return p.kv.UpdateTTL(ctx, key, v, rev, p.ttl)
	}
	n, err := put(rev)
	if !errors.Is(err, jetstream.ErrRevisionMismatch) && !errors.Is(err, jetstream.ErrExists) {
		return n, err
	}
	latest, lerr := p.kv.Latest(ctx, key)
	if lerr != nil {
		return 0, errors.Join(err, lerr)
	}
	return put(latest.Rev)
}

// run is the heartbeat: every third of the TTL, until Stop.
func (p *Presence) run() {
	defer close(p.done)
	t := time.NewTicker(p.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), p.ttl/3)
			if err := p.beat(ctx); err != nil {
				p.log.Warn().Err(err).Str("ttl", logging.Duration(p.ttl)).Msg("liveness heartbeat failed; retrying at the next tick")
			}
			cancel()
		}
	}
}

// Stop ends the heartbeat and withdraws the worker's liveness records
// (purged, leaving a marker that expires after WorkflowsMarkerTTL). The
// known records stay. A record it could not withdraw expires by its TTL;
// the error names it. Calling Stop twice is a mistake (it panics).
func (p *Presence) Stop(ctx context.Context) error {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for wf := range p.revs {
		key := LiveKey(wf, p.id)
		if err := p.kv.Raw().Purge(ctx, key, natsjs.PurgeTTL(jetstream.WorkflowsMarkerTTL)); err != nil {
			errs = append(errs, fmt.Errorf("jetflow: withdraw liveness %s (it expires in %s): %w", key, p.ttl, err))
		}
	}
	return errors.Join(errs...)
}
