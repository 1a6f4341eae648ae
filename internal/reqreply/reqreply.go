// Package reqreply is the request-reply server that workers answer
// jetflow's NATS services with (starts on jetflow.admit.<workflow>, events
// on jetflow.events): queue-group subscriptions, a bound on the requests
// answered at once, and the check that an answer goes only to an inbox.
package reqreply

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// InboxPrefix is the prefix of the reply subjects answers are sent to
// (the NATS clients' default inbox prefix).
const InboxPrefix = "_INBOX."

// ErrNotInbox: a request whose reply subject is not an inbox. NATS does
// not check the reply subject a publisher sets, and a worker answers with
// its own rights: answered, such a request would make the worker publish
// its answer on a subject its sender may not write (a KV key, a task).
var ErrNotInbox = errors.New("jetflow: reply subject is not an inbox")

// CheckReply returns ErrNotInbox unless reply is a subject under
// InboxPrefix (and not a wildcard).
func CheckReply(reply string) error {
	if !strings.HasPrefix(reply, InboxPrefix) || len(reply) == len(InboxPrefix) || strings.ContainsAny(reply, "*> \t") {
		return fmt.Errorf("%w: %q", ErrNotInbox, reply)
	}
	return nil
}

// Handler answers one request: it returns the reply's bytes.
type Handler func(m *nats.Msg) []byte

// Serve answers the requests on subjects in the queue group queue, at
// most max at a time, each in a goroutine of its own. A request whose
// reply subject is not an inbox is not answered (CheckReply) and is logged
// at warn level. The returned function drains the subscriptions. Serve
// returns once the server has them: a request sent after it finds a
// responder.
func Serve(nc *nats.Conn, queue string, subjects []string, max int, log zerolog.Logger, handle Handler) (func() error, error) {
	var subs []*nats.Subscription
	stop := func() error {
		var errs []error
		for _, s := range subs {
			errs = append(errs, s.Drain())
		}
		return errors.Join(errs...)
	}
	slots := make(chan struct{}, max)
	for _, subject := range subjects {
		s, err := nc.QueueSubscribe(subject, queue, func(m *nats.Msg) {
			if err := CheckReply(m.Reply); err != nil {
				log.Warn().Err(err).Str("subject", m.Subject).Msg("request not answered: its reply subject is not an inbox")
				return
			}
			slots <- struct{}{}
			go func() {
				defer func() { <-slots }()
				if err := m.Respond(handle(m)); err != nil {
					// The caller times out and may retry: every service is
					// idempotent.
					log.Warn().Err(err).Str("subject", m.Subject).Msg("cannot answer request")
				}
			}()
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("jetflow: serve %s: %w", subject, err), stop())
		}
		subs = append(subs, s)
	}
	if err := nc.Flush(); err != nil {
		return nil, errors.Join(fmt.Errorf("jetflow: serve %s: %w", strings.Join(subjects, ", "), err), stop())
	}
	return stop, nil
}
