package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/natsconn"
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
	// waiting describes the last failed attempt, for /readyz.
	waiting natsconn.Waiting
}

// Ready is the readiness check "jetflow": not ready until connected, then
// Client.Ready.
func (p *pendingClient) Ready(ctx context.Context) error {
	c := p.client.Load()
	if c == nil {
		if w := p.waiting.String(); w != "" {
			return fmt.Errorf("%w: %s", errNotConnected, w)
		}
		return errNotConnected
	}
	return c.Ready(ctx)
}

// connect calls dial until it returns a connection and a client
// (natsconn.Wait: each failure logged and shown by Ready, the next attempt
// after a backoff), then serves that client and returns the connection.
// It gives up only on an error that trying again cannot fix
// (natsconn.IsPermanent), returned as it is, or when ctx ends (ctx's
// error).
func (p *pendingClient) connect(ctx context.Context, url string, log zerolog.Logger, dial func(context.Context) (*nats.Conn, *jetflow.Client, error)) (*nats.Conn, error) {
	type bound struct {
		nc     *nats.Conn
		client *jetflow.Client
	}
	b, err := natsconn.Wait(ctx, url, log, &p.waiting, func(ctx context.Context) (bound, error) {
		nc, client, err := dial(ctx)
		return bound{nc, client}, err
	})
	if err != nil {
		return nil, err
	}
	p.client.Store(b.client)
	return b.nc, nil
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

func (p *pendingClient) UnblockRun(ctx context.Context, runID string, opts jetflow.UnblockOptions) (jetflow.UnblockOutcome, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.UnblockOutcome{}, err
	}
	return c.UnblockRun(ctx, runID, opts)
}

func (p *pendingClient) Rerun(ctx context.Context, runID string, opts jetflow.RerunOptions) (jetflow.RerunResult, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.RerunResult{}, err
	}
	return c.Rerun(ctx, runID, opts)
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

func (p *pendingClient) EngineStatus(ctx context.Context) (jetflow.EngineStatus, error) {
	c, err := p.get()
	if err != nil {
		return jetflow.EngineStatus{}, err
	}
	return c.EngineStatus(ctx)
}
