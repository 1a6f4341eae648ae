package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/server/timeline"
)

// The backoff between two tries of a command that rides out NATS being
// unavailable (wait, watch): retryFirst, doubling up to retryMax.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
)

// patience lets wait and watch ride out NATS being unavailable (a NATS
// server, or the worker that embeds it, restarting): a call that fails
// with jetflow.ErrUnavailable (the connection too) is tried again, with
// backoff, until the command's --timeout runs out. The nil *patience
// retries nothing: the other commands fail at once with exit code 5.
type patience struct {
	// deadline, when not zero, ends the retries (wait: the end of its
	// --timeout, which the whole wait shares).
	deadline time.Time
	// window, when not zero, is the longest one outage is ridden out,
	// counted from its first failure (watch's --timeout: watch itself
	// runs until the run ends).
	window time.Duration
	// notes receives one line when an outage begins.
	notes io.Writer
	// nc is the connection once made: at wait's deadline, its state says
	// whether NATS was the reason nothing was seen.
	nc *nats.Conn

	outage time.Time // when the current outage began; zero: none
	delay  time.Duration
}

// retry reports whether to try again after err, having waited the backoff
// first; false, at once, for an error other than jetflow.ErrUnavailable
// (nil included) or once ctx is done, and false when the time left runs
// out during the wait: the caller then returns err. The first retry of an
// outage writes a note to notes.
func (p *patience) retry(ctx context.Context, err error) bool {
	if p == nil || !errors.Is(err, jetflow.ErrUnavailable) || ctx.Err() != nil {
		return false
	}
	now := time.Now()
	first := p.outage.IsZero()
	if first {
		p.outage, p.delay = now, retryFirst
	}
	end := p.deadline
	if p.window > 0 {
		end = p.outage.Add(p.window)
	}
	left := end.Sub(now)
	if left <= 0 {
		return false
	}
	if first {
		fmt.Fprintf(p.notes, "retrying: %s (for up to %s)\n", timeline.Clean(err.Error()), left.Round(time.Second))
	}
	t := time.NewTimer(min(p.delay, left))
	defer t.Stop()
	p.delay = min(2*p.delay, retryMax)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	return time.Now().Before(end)
}

// ok ends the current outage: a call succeeded. The next failure begins a
// new one, with a window and a backoff of its own.
func (p *patience) ok() {
	if p != nil {
		p.outage = time.Time{}
	}
}

// down is nil while the connection is up (or was never made), and an error
// matching jetflow.ErrUnavailable that names its state otherwise.
func (p *patience) down() error {
	if p == nil || p.nc == nil {
		return nil
	}
	if s := p.nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("%w: the connection to NATS is %s", jetflow.ErrUnavailable, s)
	}
	return nil
}

// connect connects to NATS and binds a client, trying again while that
// fails with jetflow.ErrUnavailable and p allows. Its error is printable
// as it is.
func connect(ctx context.Context, c cli, p *patience) (*nats.Conn, *jetflow.Client, error) {
	for {
		nc, err := c.nats.Connect("jetflow-producer", nats.Timeout(5*time.Second))
		if err != nil {
			err = fmt.Errorf("%w (is a worker or NATS server running?)", jetstream.Unavailable(err))
		} else {
			var client *jetflow.Client
			if client, err = newClient(ctx, nc, c, jetflow.ClientConfig{}); err == nil {
				p.ok()
				if p != nil {
					p.nc = nc
				}
				return nc, client, nil
			}
			nc.Close()
		}
		if !p.retry(ctx, err) {
			return nil, nil, err
		}
	}
}
