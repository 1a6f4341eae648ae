package natsconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/logging"
)

// The backoff between two attempts of Wait: the first retry after
// RetryFirst, each later one after twice the wait before, at most RetryMax.
// Once connected, a connection reconnects by itself
// (jetstream.ConnOptions).
const (
	RetryFirst = 250 * time.Millisecond
	RetryMax   = 2 * time.Second
)

// Waiting says what a process that waits for NATS at start-up is waiting
// for, for its readiness check: empty until an attempt failed, then the
// last failure. The zero value is ready to use; a nil *Waiting records
// nothing.
type Waiting struct {
	mu   sync.Mutex
	last string
}

// String is the last failed attempt ("waiting for NATS at <url> for <d>,
// attempt <n>: <error>"), or "" before the first.
func (w *Waiting) String() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *Waiting) set(s string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = s
}

// Wait calls dial until it succeeds, and returns its result. Each failed
// attempt is logged at warn ("waiting for NATS at <url>", with the
// attempt's number, the time waited so far and the error; "waiting for
// <what>" for an error of WaitingFor) and recorded in w; the next one follows after a backoff (RetryFirst doubling to
// RetryMax). A success after failures is logged at info. Wait gives up
// only on an error that trying again cannot fix (IsPermanent), returned
// as it is, or when ctx ends (ctx's error). Serving a readiness check that
// says "not ready" while Wait runs, instead of exiting, lets an
// orchestrator that starts everything at once (Compose, Kubernetes) see a
// live process that is not ready yet.
func Wait[T any](ctx context.Context, url string, log zerolog.Logger, w *Waiting, dial func(context.Context) (T, error)) (T, error) {
	var zero T
	begin := time.Now()
	delay := RetryFirst
	timer := time.NewTimer(0)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-timer.C:
		}
		v, err := dial(ctx)
		if err == nil {
			if attempt > 1 {
				log.Info().Str("url", url).Int("attempts", attempt).Str("waited", logging.Duration(time.Since(begin))).
					Msg("reached NATS after waiting for it")
			}
			return v, nil
		}
		if ctx.Err() != nil {
			return zero, ctx.Err()
		}
		if IsPermanent(err) {
			return zero, err
		}
		waited := time.Since(begin)
		what := "NATS at " + url
		var other *waitingForError
		if errors.As(err, &other) {
			what = other.what
		}
		w.set(fmt.Sprintf("waiting for %s for %s, attempt %d: %v", what, logging.Duration(waited), attempt, err))
		log.Warn().Err(err).Str("url", url).Int("attempt", attempt).Str("waited", logging.Duration(waited)).
			Str("next_attempt_in", logging.Duration(delay)).Msg("waiting for " + what)
		timer.Reset(delay)
		delay = min(2*delay, RetryMax)
	}
}

// IsPermanent reports whether err, from connecting to NATS and binding to
// the engine's streams, is one that waiting does not fix, so that the
// process exits with it: a connection setting that cannot be used (a
// SettingError: a malformed URL, a file that cannot be read), credentials
// the server refuses, or TLS that cannot be agreed on (a server
// certificate that is not trusted, TLS wanted on one side only). A
// refused credential does not become valid by itself: exiting shows the
// misconfiguration where an orchestrator shows failures (a crash loop
// with the reason in the log), and a restart after the fix retries
// anyway; a process that stayed unready would hide it. Everything else is
// waited out: a server not listening yet, a name that does not resolve
// yet (a Service being created), a timeout, JetStream not up yet, and a
// provisioning error (the buckets a worker creates, which a producer user
// may not, before the first worker has run). An error marked Permanent is
// permanent.
func IsPermanent(err error) bool {
	var (
		setting *SettingError
		verify  *tls.CertificateVerificationError
		marked  *permanentError
	)
	if errors.As(err, &marked) {
		return true
	}
	for _, e := range []error{
		nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		nats.ErrSecureConnRequired, nats.ErrSecureConnWanted,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return errors.As(err, &setting) || errors.As(err, &verify)
}

// Permanent marks err as one that Wait must not wait out (IsPermanent);
// Cause takes the mark off again. nil stays nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// Cause is err without Permanent's mark.
func Cause(err error) error {
	var p *permanentError
	if errors.As(err, &p) {
		return p.err
	}
	return err
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// WaitingFor marks err, from an attempt of Wait, as a wait for something
// other than NATS, which what names ("workers of another version to
// stop"): Wait logs and records the attempt as "waiting for <what>"
// instead of "waiting for NATS at <url>". errors.Is and errors.As see err
// through it; nil stays nil.
func WaitingFor(what string, err error) error {
	if err == nil {
		return nil
	}
	return &waitingForError{what: what, err: err}
}

type waitingForError struct {
	what string
	err  error
}

func (e *waitingForError) Error() string { return e.err.Error() }
func (e *waitingForError) Unwrap() error { return e.err }
