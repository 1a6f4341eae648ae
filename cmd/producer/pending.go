package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/server/natsconn"
)

// The backoff of producer serve's attempts to reach NATS at start-up: the
// first retry after connectRetryFirst, each later one after twice the
// wait before, at most connectRetryMax. Once connected, the connection
// reconnects by itself (jetstream.ConnOptions).
const (
	connectRetryFirst = 250 * time.Millisecond
	connectRetryMax   = 2 * time.Second
)

// errNotConnected answers every API call that producer serve receives
// before it has reached NATS: it matches jetflow.ErrUnavailable, so that
// the API answers 503 with Retry-After.
var errNotConnected = fmt.Errorf("%w: producer serve has not reached NATS yet", jetflow.ErrUnavailable)

// pendingClient is producer serve's backend (httpapi.Backend,
// inspector.Backend): errNotConnected until connect has bound a client,
// that client afterwards. Serving HTTP before NATS is reachable lets an
// orchestrator that starts everything at once (Compose, Kubernetes) see a
// live process that is not ready yet, instead of one that exits.
type pendingClient struct {
	client atomic.Pointer[jetflow.Client]

	mu sync.Mutex
	// waiting describes the last failed attempt, for /readyz.
	waiting string
}

// Ready is the readiness check "jetflow": not ready until connected, then
// Client.Ready.
func (p *pendingClient) Ready(ctx context.Context) error {
	c := p.client.Load()
	if c == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.waiting != "" {
			return fmt.Errorf("%w: %s", errNotConnected, p.waiting)
		}
		return errNotConnected
	}
	return c.Ready(ctx)
}

// connect calls dial until it returns a connection and a client, which it
// then serves, and returns the connection. Each failed attempt is logged
// at warn ("waiting for NATS at <url>", with the attempt's number, the
// time waited so far and the error) and shown by Ready; the next one
// follows after a backoff (connectRetryFirst doubling to connectRetryMax).
// It gives up only on an error that trying again cannot fix
// (isPermanent), returned as it is, or when ctx ends (ctx's error).
func (p *pendingClient) connect(ctx context.Context, url string, log zerolog.Logger, dial func(context.Context) (*nats.Conn, *jetflow.Client, error)) (*nats.Conn, error) {
	begin := time.Now()
	delay := connectRetryFirst
	timer := time.NewTimer(0)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		}
		nc, client, err := dial(ctx)
		if err == nil {
			p.client.Store(client)
			if attempt > 1 {
				log.Info().Str("url", url).Int("attempts", attempt).Str("waited", logging.Duration(time.Since(begin))).
					Msg("reached NATS after waiting for it")
			}
			return nc, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if isPermanent(err) {
			return nil, err
		}
		waited := time.Since(begin)
		p.mu.Lock()
		p.waiting = fmt.Sprintf("waiting for NATS at %s for %s, attempt %d: %v", url, logging.Duration(waited), attempt, err)
		p.mu.Unlock()
		log.Warn().Err(err).Str("url", url).Int("attempt", attempt).Str("waited", logging.Duration(waited)).
			Str("next_attempt_in", logging.Duration(delay)).Msg("waiting for NATS at " + url)
		timer.Reset(delay)
		delay = min(2*delay, connectRetryMax)
	}
}

// isPermanent reports whether err, from connecting to NATS and binding the
// client, is one that waiting does not fix, so that producer serve exits
// with it: a connection setting that cannot be used (natsconn's checks:
// a malformed URL, a file that cannot be read), credentials the server
// refuses, or TLS that cannot be agreed on (a server certificate that is
// not trusted, TLS wanted on one side only). A refused credential does
// not become valid by itself: exiting shows the misconfiguration where an
// orchestrator shows failures (a crash loop with the reason in the log),
// and a restart after the fix retries anyway; a process that stayed
// unready would hide it. Everything else is waited out: a server not
// listening yet, a name that does not resolve yet (a Service being
// created), a timeout, JetStream not up yet, and a provisioning error
// (the buckets a worker creates, which a producer user may not, before
// the first worker has run).
func isPermanent(err error) bool {
	var setting *natsconn.SettingError
	var verify *tls.CertificateVerificationError
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

func (p *pendingClient) get() (*jetflow.Client, error) {
	if c := p.client.Load(); c != nil {
		return c, nil
	}
	return nil, errNotConnected
}

func (p *pendingClient) StartByName(ctx context.Context, name string, input json.RawMessage, opts ...jetflow.StartOption) (jetflow.StartResult, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.StartResult{}, err
	}
	return c.StartByName(ctx, name, input, opts...)
}

func (p *pendingClient) GetRun(ctx context.Context, runID string) (jetflow.Run, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.Run{}, err
	}
	return c.GetRun(ctx, runID)
}

func (p *pendingClient) Steps(ctx context.Context, runID string) ([]jetflow.StepRecord, error) {
	c, err := p.get()
	if err != nil {
		return nil, err
	}
	return c.Steps(ctx, runID)
}

func (p *pendingClient) WaitRun(ctx context.Context, runID string) (jetflow.Run, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.Run{}, err
	}
	return c.WaitRun(ctx, runID)
}

func (p *pendingClient) ListRuns(ctx context.Context, opts jetflow.ListOptions) (jetflow.RunPage, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.RunPage{}, err
	}
	return c.ListRuns(ctx, opts)
}

func (p *pendingClient) CountRuns(ctx context.Context, workflow string) (jetflow.RunCounts, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.RunCounts{}, err
	}
	return c.CountRuns(ctx, workflow)
}

func (p *pendingClient) OpenSteps(ctx context.Context, runID string) ([]jetflow.OpenStep, error) {
	c, err := p.get()
	if err != nil {
		return nil, err
	}
	return c.OpenSteps(ctx, runID)
}

func (p *pendingClient) ResetTaskKey(ctx context.Context, key string, scope jetflow.KeyScope, scopeID string) (int, error) {
	c, err := p.get()
	if err != nil {
		return 0, err
	}
	return c.ResetTaskKey(ctx, key, scope, scopeID)
}

func (p *pendingClient) CancelRun(ctx context.Context, runID string) (jetflow.CancelOutcome, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.CancelOutcome{}, err
	}
	return c.CancelRun(ctx, runID)
}

func (p *pendingClient) SendEvent(ctx context.Context, runID, name, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.EventResult{}, err
	}
	return c.SendEvent(ctx, runID, name, eventID, payload)
}

func (p *pendingClient) Resume(ctx context.Context, token, eventID string, payload json.RawMessage) (jetflow.EventResult, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.EventResult{}, err
	}
	return c.Resume(ctx, token, eventID, payload)
}

func (p *pendingClient) Describe(ctx context.Context, runID string) (jetflow.RunDescription, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.RunDescription{}, err
	}
	return c.Describe(ctx, runID)
}

func (p *pendingClient) Roster(ctx context.Context) (jetflow.Roster, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.Roster{}, err
	}
	return c.Roster(ctx)
}
