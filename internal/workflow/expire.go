package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// expireChunk bounds the keys of one batch read of Expire: a direct get
// answers at most 1,024 messages.
const expireChunk = 256

// Expire removes the records of the ended run generations runs: the hook
// tokens their waits recorded (each only while its record is still that
// run's: a token a later generation took is left alone), then their steps
// and lease (jetflow_steps, the keys <identity>.>), then their attempt
// and wait records (jetflow_attempts, the same keys), which come last
// because they are how the hook tokens are found. A run generation whose
// identity now belongs to another run — a first generation started again
// under the same run ID after the expiry marker of the ended one had
// expired too, which only a removal late by more than the deployment's
// retention can meet — or whose record says it is running is left alone.
//
// A removal is a stream purge: it leaves no marker, and it is idempotent,
// so a repeat call (the expiry's timer delivered again after a crash or an
// error) removes what is left. The records of an ended run are read by
// nothing that decides, so a purge the server's file store undoes after a
// hard kill leaves records nobody reads as live (see docs/ARCHITECTURE.md,
// "The retention of a run's records").
func Expire(ctx context.Context, assets *jetstream.Assets, runs []state.EndedRun) error {
	runs, err := ended(ctx, assets, runs)
	if err != nil {
		return err
	}
	// Most runs have no attempt or wait record (a step retried, a wait):
	// one read of a batch's tells which do, and their hook tokens.
	attempts, err := attemptRecords(ctx, assets, runs)
	if err != nil {
		return err
	}
	if err := expireHooks(ctx, assets, runs, attempts); err != nil {
		return err
	}
	for _, r := range runs {
		if _, err := assets.Steps.Purge(ctx, r.Identity()+".>", 0); err != nil {
			return err
		}
	}
	for _, r := range runs {
		if len(attempts[r.Identity()]) == 0 {
			continue
		}
		if _, err := assets.Attempts.Purge(ctx, r.Identity()+".>", 0); err != nil {
			return err
		}
	}
	return nil
}

// ended is runs without those whose identity is live: the run record of
// its run ID holds the same generation, running, or started by another
// token.
func ended(ctx context.Context, assets *jetstream.Assets, runs []state.EndedRun) ([]state.EndedRun, error) {
	live := make(map[string]bool)
	for chunk := range slices.Chunk(runs, expireChunk) {
		ids := make([]string, len(chunk))
		for i, r := range chunk {
			ids[i] = r.RunID
		}
		entries, err := assets.Runs.Last(ctx, ids...)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			run, err := state.DecodeRun(e.Value)
			if err != nil {
				continue // not a run this removal could hurt
			}
			for _, r := range chunk {
				if r.RunID == run.RunID && r.Generation == run.Generation &&
					(run.Token != r.Token || !run.Status.Terminal()) {
					live[r.Identity()] = true
				}
			}
		}
	}
	out := runs[:0:0]
	for _, r := range runs {
		if !live[r.Identity()] {
			out = append(out, r)
		}
	}
	return out, nil
}

// attemptRecords reads the attempt and wait records of runs, by identity:
// a batch read for each expireChunk of them (a run with more records than
// one read returns is read on its own).
func attemptRecords(ctx context.Context, assets *jetstream.Assets, runs []state.EndedRun) (map[string][]jetstream.Entry, error) {
	out := make(map[string][]jetstream.Entry)
	for chunk := range slices.Chunk(runs, expireChunk) {
		filters := make([]string, len(chunk))
		for i, r := range chunk {
			filters[i] = r.Identity() + ".>"
		}
		entries, err := assets.Attempts.Last(ctx, filters...)
		if errors.Is(err, jetstream.ErrTooManyKeys) {
			entries = nil
			for _, f := range filters {
				some, err := assets.Attempts.Matching(ctx, f)
				if err != nil {
					return nil, err
				}
				entries = append(entries, some...)
			}
		} else if err != nil {
			return nil, err
		}
		for _, e := range entries {
			identity, _, _ := strings.Cut(e.Key, ".")
			out[identity] = append(out[identity], e)
		}
	}
	return out, nil
}

// expireHooks removes the records of the hook tokens runs waited on, as
// their wait records (among attempts, by identity) name them, while each
// still names its run.
func expireHooks(ctx context.Context, assets *jetstream.Assets, runs []state.EndedRun, attempts map[string][]jetstream.Entry) error {
	owner := make(map[string]state.EndedRun) // by token
	for _, r := range runs {
		for _, e := range attempts[r.Identity()] {
			if !state.IsWaitKey(e.Key) {
				continue
			}
			w, err := state.DecodeWait(e.Value)
			if err == nil && w.Kind == state.StepHook && w.Token != "" {
				owner[w.Token] = r
			}
		}
	}
	tokens := make([]string, 0, len(owner))
	for t := range owner {
		tokens = append(tokens, t)
	}
	for chunk := range slices.Chunk(tokens, expireChunk) {
		hooks, err := assets.Hooks.Last(ctx, chunk...)
		if err != nil {
			return err
		}
		for _, e := range hooks {
			h, err := state.DecodeHook(e.Value)
			r := owner[e.Key]
			if err != nil || h.RunID != r.RunID || h.Generation != r.Generation || r.Token != "" && h.RunToken != r.Token {
				continue // another run's now
			}
			if _, err := assets.Hooks.Purge(ctx, e.Key, e.Rev); err != nil {
				return fmt.Errorf("jetflow: expire hook token %s: %w", e.Key, err)
			}
		}
	}
	return nil
}

// Expirer carries out due expiries (jetstream.ScheduleExpiry; a
// consume.Handler of the consumer jetstream.ExpiryConsumer): it removes
// the records of the expiry's runs (Expire), then acknowledges it. On a
// NATS error it hands the expiry back, to be tried again a second later.
type Expirer struct {
	Assets *jetstream.Assets
	Log    zerolog.Logger
}

// Handle carries out one due expiry.
func (x *Expirer) Handle(ctx context.Context, d *consume.Delivery) {
	msg := d.Msg
	e, err := state.DecodeExpiry(msg.Data())
	if err != nil {
		x.Log.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed due expiry terminated")
		x.settle(msg.TermWithReason("malformed due expiry"))
		return
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := Expire(ectx, x.Assets, e.Runs); err != nil {
		x.Log.Warn().Err(err).Int("runs", len(e.Runs)).Msg("cannot remove the records of ended runs; retrying")
		x.settle(msg.NakWithDelay(time.Second))
		return
	}
	x.settle(msg.Ack())
}

// Release hands a due expiry back.
func (x *Expirer) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

func (x *Expirer) settle(err error) { logSettle(x.Log, "due expiry", err) }
