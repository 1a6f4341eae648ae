package jetflow

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// deniedPublish reads the subject out of the server's report of a refused
// publish (nats.ErrPermissionViolation, delivered to the connection's
// error handler): Permissions Violation for Publish to "<subject>".
var deniedPublish = regexp.MustCompile(`(?i)violation for publish to "([^"]+)"`)

// denials turns the server's refusal of a publish, which NATS reports only
// asynchronously (the publish itself is dropped, and a request waits for
// a reply that never comes), into the prompt failure of the calls that
// wait on such a write, with ErrPermissionDenied.
type denials struct {
	once    sync.Once
	mu      sync.Mutex
	next    int
	waiters map[int]denialWaiter
}

type denialWaiter struct {
	prefixes []string
	cancel   context.CancelCauseFunc
}

// watch returns a context derived from ctx that is cancelled, with a cause
// matching ErrPermissionDenied, as soon as the server refuses a publish on
// nc to a subject that starts with one of prefixes; stop ends the watch.
// The first call chains a handler onto nc's error handler (the handler set
// before is still called with every error); a handler set on nc later
// replaces it, and a refused write then fails only when ctx ends. A
// refusal of another call's publish on the same connection, to a subject
// under the same prefixes, fails the watched call too.
func (d *denials) watch(ctx context.Context, nc *nats.Conn, prefixes ...string) (_ context.Context, stop func()) {
	d.once.Do(func() {
		prev := nc.ErrorHandler()
		nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
			d.report(err)
			if prev != nil {
				prev(c, s, err)
			}
		})
	})
	wctx, cancel := context.WithCancelCause(ctx)
	d.mu.Lock()
	if d.waiters == nil {
		d.waiters = map[int]denialWaiter{}
	}
	id := d.next
	d.next++
	d.waiters[id] = denialWaiter{prefixes: prefixes, cancel: cancel}
	d.mu.Unlock()
	return wctx, func() {
		d.mu.Lock()
		delete(d.waiters, id)
		d.mu.Unlock()
		cancel(nil)
	}
}

// report cancels the watches whose prefixes cover the subject of a refused
// publish; other errors are not its business.
func (d *denials) report(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := deniedPublish.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	subject := m[1]
	cause := fmt.Errorf("%w: the NATS server refused a publish to %s: the connection's user may not write it", ErrPermissionDenied, subject)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.waiters {
		for _, p := range w.prefixes {
			if strings.HasPrefix(subject, p) {
				w.cancel(cause)
				break
			}
		}
	}
}

// deniedErr returns err with the refusal that cut wctx short and hint (what
// the call needs) in front of it, so that it matches ErrPermissionDenied
// and no longer reads as a timeout, or err unchanged when wctx was not cut
// short by a refusal.
func deniedErr(wctx context.Context, err error, hint string) error {
	if err == nil || errors.Is(err, ErrPermissionDenied) {
		return err
	}
	if cause := context.Cause(wctx); errors.Is(cause, ErrPermissionDenied) {
		return fmt.Errorf("%w; %s (%v)", cause, hint, err)
	}
	return err
}
