package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Task idempotency keys (G7).
//
// A step called with a key looks the key up in the task-keys bucket before
// it runs, in the task that owns the step (replays of a committed step never
// touch the key):
//
//   - absent (never written, expired, released or reset): create a claim,
//     with compare-and-set against the marker when there is one. The claim's
//     message TTL is its lease; the holder renews it every lease/3 while the
//     step runs. Winning the create is the right to run the step.
//   - a result (state done): the step does not run; its record is committed
//     with that result, marked as served from the key.
//   - a claim of this very step ID (a redelivery after the holder died, or
//     a zombie): taken over at once with compare-and-set.
//   - a claim of another step: wait, watching the key, until it changes. A
//     claim whose revision has not changed for a whole lease (by the
//     waiter's own clock, plus a second) is taken over with compare-and-set;
//     usually the broker has expired it by then and the create wins.
//
// After the step, the holder writes its result over its claim (compare-and-
// set on the claim's revision, message TTL = the key's TTL) before the step
// record is committed, so a crash between the two leaves a result that the
// redelivered task finds as its own. A failure is not cached unless the
// call asks for it: the claim is released (a purge with compare-and-set) and
// the next call runs the step. A holder that lost its claim (reset, taken
// over after a stall) still commits its step record but leaves the key
// alone.

// DefaultKeyLease is the lease of a claim when the call sets none: three
// default AckWaits, so that a crashed holder's own task, redelivered after
// AckWait, normally takes its claim back (same step ID, same external
// Idempotency-Key) before anyone else does.
const DefaultKeyLease = 90 * time.Second

// leaseGrace is added to a lease before a waiter takes a claim over: the
// broker's TTLs count whole seconds.
const leaseGrace = time.Second

// TaskKey is the task idempotency key of one step call. The zero value is
// no key.
type TaskKey struct {
	// Key is the caller's key; Set records that one was given (an empty
	// key is an error, not "no key").
	Key string
	Set bool
	// TTL is how long the result is returned without running the step.
	TTL time.Duration
	// Scope decides who shares the key.
	Scope state.KeyScope
	// CacheFailures caches a final failure too.
	CacheFailures bool
	// Lease bounds how long a claim whose holder stopped renewing it blocks
	// the key (default DefaultKeyLease, at least 1s).
	Lease time.Duration
	// Others is set when an option other than the key was given.
	Others bool
}

func (k TaskKey) used() bool { return k.Set || k.Others }

// Validate checks the options; the zero value is valid (no key).
func (k TaskKey) Validate() error {
	if !k.used() {
		return nil
	}
	if !k.Set {
		return fmt.Errorf("%w: task key options without a key (WithTaskKey)", state.ErrInvalidTaskKey)
	}
	if err := state.ValidateTaskKey(k.Key); err != nil {
		return err
	}
	switch {
	case k.TTL < state.MinTaskKeyTTL:
		return fmt.Errorf("%w: TTL %s is shorter than %s", state.ErrInvalidTaskKey, k.TTL, state.MinTaskKeyTTL)
	case k.Lease != 0 && k.Lease < state.MinTaskKeyTTL:
		return fmt.Errorf("%w: lease %s is shorter than %s", state.ErrInvalidTaskKey, k.Lease, state.MinTaskKeyTTL)
	case k.Scope < state.ScopeRun || k.Scope > state.ScopeGlobal:
		return fmt.Errorf("%w: unknown scope %d", state.ErrInvalidTaskKey, int(k.Scope))
	}
	return nil
}

// keyCall is the task key of the step a task is about to execute. A nil
// *keyCall is no key: every method is a no-op.
type keyCall struct {
	e      *Executor
	opts   TaskKey
	key    string // in the bucket
	stepID string
	lease  time.Duration
	token  string
	log    zerolog.Logger

	// ref marks the committed step record (which key, whose result).
	ref *state.StepKeyRef

	mu       sync.Mutex
	held     bool   // this call holds the claim at rev
	rev      uint64 // of the claim
	stopBeat func()
}

// keyCall returns the task key of the step call sc, or nil when the call
// has none.
func (e *Executor) keyCall(d *delivery, sc *stepCall) (*keyCall, error) {
	k, name, id := sc.taskKey, sc.name, sc.id
	if !k.used() {
		return nil, nil
	}
	var (
		bkey string
		err  error
	)
	switch k.Scope {
	case state.ScopeRun: // private to this generation of the run
		bkey, err = state.RunTaskKeyName(d.run.RunID, d.run.Generation, name, k.Key)
	case state.ScopeWorkflow:
		bkey, err = state.TaskKeyName(k.Scope, d.run.Workflow, name, k.Key)
	default:
		bkey, err = state.TaskKeyName(k.Scope, "", name, k.Key)
	}
	if err != nil { // validated by Step; the run ID and name are valid
		return nil, err
	}
	lease := k.Lease
	if lease == 0 {
		lease = DefaultKeyLease
	}
	lease = jetstream.WholeSeconds(lease)
	return &keyCall{
		e: e, opts: k, key: bkey, stepID: id, lease: lease, token: nuid.Next(),
		log: d.stepLogger(id).With().Str("task_key", bkey).Logger(),
	}, nil
}

// acquire returns the result stored under the key, or nil when this call
// now holds the claim and must run the step. It waits while another step
// holds the key, until the worker stops (ctx); NATS operations use nctx.
// The caller releases the task on an error (it is retried soon).
func (k *keyCall) acquire(ctx, nctx context.Context) (*state.TaskKeyEntry, error) {
	if k == nil {
		return nil, nil
	}
	ent, err := k.acquireLoop(ctx, nctx)
	if err != nil {
		return nil, fmt.Errorf("task key %s: %w", k.key, err)
	}
	return ent, nil
}

func (k *keyCall) acquireLoop(ctx, nctx context.Context) (*state.TaskKeyEntry, error) {
	store := k.e.cfg.Assets.TaskKeys
	var (
		w       natsjs.KeyWatcher
		seenRev uint64
		seenAt  time.Time
	)
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, err := store.Latest(nctx, k.key)
		if err != nil {
			return nil, err
		}
		if !st.Live {
			if ok, err := k.claimOver(nctx, st.Rev); ok || err != nil {
				return nil, err
			}
			continue // another caller claimed it first
		}
		ent, err := state.DecodeTaskKeyEntry(st.Value)
		if err != nil {
			// Never let a bad entry block the key: take it over.
			k.log.Error().Err(err).Msg("malformed task key entry; claiming over it")
			if ok, err := k.claimOver(nctx, st.Rev); ok || err != nil {
				return nil, err
			}
			continue
		}
		if ent.Gone(k.e.cfg.Now()) {
			// A reset, or a result past its time that the bucket still
			// holds (a removal undone): as good as absent.
			if ok, err := k.claimOver(nctx, st.Rev); ok || err != nil {
				return nil, err
			}
			continue
		}
		if ent.State == state.TaskKeyDone {
			k.ref = &state.StepKeyRef{Key: k.key, From: ent.Owner, Served: ent.Owner != k.stepID}
			return &ent, nil
		}
		if ent.Owner == k.stepID {
			// This step's own claim: its holder died and the task came back,
			// or a zombie still runs it. The step runs again under the same
			// step ID, as it would without a key.
			if ok, err := k.claimOver(nctx, st.Rev); ok || err != nil {
				return nil, err
			}
			continue
		}
		now := time.Now()
		if st.Rev != seenRev {
			seenRev, seenAt = st.Rev, now
		}
		patience := ent.Lease() + leaseGrace
		if now.Sub(seenAt) >= patience {
			// Not renewed for a whole lease: the holder is gone.
			k.log.Warn().Str("holder", ent.Owner).Str("holder_worker", ent.Worker).
				Msg("task key claim not renewed within its lease; taking it over")
			if ok, err := k.claimOver(nctx, st.Rev); ok || err != nil {
				return nil, err
			}
			continue
		}
		if w == nil {
			if w, err = store.Watch(ctx, k.key); err != nil {
				return nil, err
			}
			continue // read again: the key may have changed before the watch began
		}
		timer := time.NewTimer(patience - now.Sub(seenAt))
		select {
		case _, ok := <-w.Updates():
			if !ok { // the watch ended: start another
				_ = w.Stop()
				w = nil
			}
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
}

// claimOver writes this call's claim over the key's last message at rev
// (0: the key has none): a marker, an entry that is Gone, or one taken
// over. ok is false when another write came first.
func (k *keyCall) claimOver(nctx context.Context, rev uint64) (bool, error) {
	nrev, err := k.e.cfg.Assets.TaskKeys.Create(nctx, k.key, k.claim(), rev, k.lease)
	if errors.Is(err, jetstream.ErrExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	k.hold(nrev)
	return true, nil
}

func (k *keyCall) claim() []byte {
	now := k.e.cfg.Now().UTC()
	b, err := state.Encode(state.TaskKeyEntry{
		V: state.Version, State: state.TaskKeyClaimed, Owner: k.stepID, Token: k.token, Worker: k.e.cfg.WorkerID,
		LeaseMS: k.lease.Milliseconds(), LeaseUntil: now.Add(k.lease), At: now,
	})
	if err != nil {
		panic(err) // a claim is small and always encodes
	}
	return b
}

// hold records the claim at rev and starts renewing it every third of the
// lease.
func (k *keyCall) hold(rev uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held, k.rev = true, rev
	k.ref = &state.StepKeyRef{Key: k.key, From: k.stepID}
	k.stopBeat = consume.Heartbeat(k.lease/3, k.renew)
}

func (k *keyCall) renew() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.held {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.lease/3)
	defer cancel()
	rev, err := k.e.cfg.Assets.TaskKeys.Replace(ctx, k.key, k.claim(), k.rev, k.lease)
	if errors.Is(err, jetstream.ErrRevisionMismatch) {
		// A renewal whose answer was lost (a timeout under load) may have
		// been stored: the key then holds this claim's own token.
		if own, ok := k.ownClaim(); ok {
			rev, err = own, nil
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrRevisionMismatch):
		// Reset, or taken over after this worker stalled: the step goes on
		// and its record is committed, but the key is not ours to write.
		k.held = false
		k.log.Warn().Msg("task key claim lost while the step ran (reset or taken over)")
	case err != nil:
		k.log.Warn().Err(err).Msg("cannot renew task key claim; retrying")
	default:
		k.rev = rev
	}
}

// ownClaim reads the key and returns its revision when it holds this
// call's claim (its token). k.mu is held.
func (k *keyCall) ownClaim() (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), k.lease/3)
	defer cancel()
	st, err := k.e.cfg.Assets.TaskKeys.Latest(ctx, k.key)
	if err != nil || !st.Live {
		return 0, false
	}
	e, err := state.DecodeTaskKeyEntry(st.Value)
	if err != nil || e.State != state.TaskKeyClaimed || e.Token != k.token {
		return 0, false
	}
	return st.Rev, true
}

// release stops renewing; it returns whether the claim was still held, and
// its revision.
func (k *keyCall) release() (bool, uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopBeat != nil {
		k.stopBeat()
		k.stopBeat = nil
	}
	held := k.held
	k.held = false
	return held, k.rev
}

// finish writes the step's final record to the key before the record is
// committed: the result (and, with CacheFailures, a failure) for the key's
// TTL; otherwise the claim is released so that the next call runs.
func (k *keyCall) finish(nctx context.Context, rec state.Step) {
	if k == nil {
		return
	}
	held, rev := k.release()
	if !held {
		return
	}
	store := k.e.cfg.Assets.TaskKeys
	if rec.Error == nil || k.opts.CacheFailures {
		now := k.e.cfg.Now().UTC()
		ttl := jetstream.WholeSeconds(k.opts.TTL)
		b, err := state.Encode(state.TaskKeyEntry{
			V: state.Version, State: state.TaskKeyDone, Owner: k.stepID, Token: k.token, Worker: k.e.cfg.WorkerID,
			Output: rec.Output, Error: rec.Error, Attempt: rec.Attempt, At: now, ExpiresAt: now.Add(ttl),
		})
		if err == nil {
			_, err = store.Replace(nctx, k.key, b, rev, ttl)
			switch {
			case errors.Is(err, jetstream.ErrRevisionMismatch):
				k.log.Warn().Msg("task key was reset or taken over while the step ran; result not cached")
			case err != nil:
				// The claim expires after its lease; the next call runs.
				k.log.Warn().Err(err).Msg("cannot store the step result under its task key")
			}
			return
		}
		k.log.Warn().Err(err).Msg("step result does not fit a task key entry; not cached")
	}
	if err := store.Release(nctx, k.key, rev); err != nil && !errors.Is(err, jetstream.ErrRevisionMismatch) {
		k.log.Warn().Err(err).Msg("cannot release task key claim; it expires after its lease")
	}
}

// abandon releases a claim still held when execute returns without a final
// result (a retry, a release, the worker stopping).
func (k *keyCall) abandon(nctx context.Context) {
	if k == nil {
		return
	}
	held, rev := k.release()
	if !held {
		return
	}
	if err := k.e.cfg.Assets.TaskKeys.Release(nctx, k.key, rev); err != nil && !errors.Is(err, jetstream.ErrRevisionMismatch) {
		k.log.Warn().Err(err).Msg("cannot release task key claim; it expires after its lease")
	}
}

// served reports whether the step's result came from another step through
// the key (a duplicate the task-key cache suppressed).
func (k *keyCall) served() bool { return k != nil && k.ref != nil && k.ref.Served }

// worker is what the step record names as its worker: the worker, and for
// a served result the key it came from, so that Client.Steps shows it.
func (k *keyCall) worker(id string) string {
	if k.served() {
		return id + " (served from task key " + k.key + ", result of " + k.ref.From + ")"
	}
	return id
}

// encode encodes the step record, with its task key reference when it has
// one.
func (k *keyCall) encode(rec state.Step) ([]byte, error) {
	if k == nil || k.ref == nil {
		return state.Encode(rec)
	}
	return state.Encode(state.KeyedStep{Step: rec, TaskKey: k.ref})
}

// ResetTaskKeys forgets every task key of filter (Client.ResetTaskKey) and
// returns how many held a claim or a result. A key is not purged: a reset
// entry (state.TaskKeyReset) is written over its value, compare-and-set,
// with a TTL that outlives what it replaced (the result's time, the claim's
// lease), so that no removal the server might undo after an unclean stop
// can bring the old value back as the key's last. The next call claims
// over the reset entry; a step running under a claim that is reset still
// commits its record and caches nothing. A repeat call finds nothing left
// to reset and returns 0.
func ResetTaskKeys(ctx context.Context, tk *jetstream.TaskKeys, filter string, now func() time.Time) (int, error) {
	keys, err := tk.Keys(ctx, filter)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, key := range keys {
		reset, err := resetTaskKey(ctx, tk, key, now)
		if err != nil {
			return n, fmt.Errorf("jetflow: reset %s/%s: %w", jetstream.TaskKeysBucket, key, err)
		}
		if reset {
			n++
		}
	}
	return n, nil
}

// resetTaskKey writes the reset entry over key's value unless it holds
// none (or one that is Gone); reset says whether it wrote one.
func resetTaskKey(ctx context.Context, tk *jetstream.TaskKeys, key string, now func() time.Time) (reset bool, _ error) {
	for {
		st, err := tk.Latest(ctx, key)
		if err != nil || !st.Live {
			return false, err
		}
		at := now().UTC()
		// An entry that does not decode is reset too, for a default lease.
		keep := DefaultKeyLease
		if ent, err := state.DecodeTaskKeyEntry(st.Value); err == nil {
			if ent.Gone(at) {
				return false, nil
			}
			keep = ent.Until(at)
		}
		keep = jetstream.WholeSeconds(keep + leaseGrace)
		b, err := state.Encode(state.TaskKeyEntry{V: state.Version, State: state.TaskKeyReset, Token: nuid.Next(), At: at, ExpiresAt: at.Add(keep)})
		if err != nil {
			return false, err
		}
		_, err = tk.Replace(ctx, key, b, st.Rev, keep)
		if errors.Is(err, jetstream.ErrRevisionMismatch) {
			continue // written meanwhile: reset what it holds now
		}
		return err == nil, err
	}
}
