package consume

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// pull keeps pull requests out for s's free slots, all answered on one
// long-lived inbox: a request asks the server for as many messages as s
// has free slots (each reserved until its message is settled, or until the
// request expires undelivered), and a new one goes out when nothing is
// requested any more, or when half of s's slots are free and unrequested.
// So a busy consumer sends one request for many messages, an idle one a
// request per fetchWait, and nothing is ever delivered that has no slot
// (no prefetch beyond the slots).
//
// When the pool stops, no request goes out any more; the loop waits for
// the open requests to expire (at most fetchWait), handing back what they
// still deliver, and unsubscribes.
func (p *Pool) pull(s *source) {
	defer p.loops.Done()
	info := s.c.CachedInfo()
	next := "$JS.API.CONSUMER.MSG.NEXT." + info.Stream + "." + info.Name
	inbox := p.nc.NewInbox()
	msgs := make(chan *nats.Msg, cap(s.own)+64)
	done := make(chan struct{})
	sub, err := p.nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case msgs <- m:
		case <-done: // a message after the loop ended is redelivered after its AckWait
		}
	})
	if err != nil {
		p.log.Error().Err(err).Str("consumer", info.Name).Msg("cannot subscribe to pull: consuming stopped")
		return
	}
	defer func() {
		close(done)
		_ = sub.Unsubscribe()
	}()
	threshold := max(1, cap(s.own)/2)
	outstanding := 0
	stopping := false
	// quiet fires when requests should have ended by now: a request lost
	// with a connection never sends its expiry.
	quiet := time.NewTimer(time.Hour)
	defer quiet.Stop()
	// gather delays a request for a few free slots while more than half
	// are busy, so that they are asked for together (see batchDelay).
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	defer gather.Stop()
	gathering, gathered := false, false
	// resume ends a pause after a request the server refused at once (no
	// consumer leader, a leadership change): while the consumer cannot
	// answer, requests go out at growing intervals, not in a busy loop.
	resume := time.NewTimer(time.Hour)
	resume.Stop()
	defer resume.Stop()
	paused, backoff := false, time.Duration(0)
	// quit is the pool's quit until the loop saw it, then nil: a closed
	// channel in the select would make it spin while the last requests
	// expire.
	quit := p.quit
	stop := func() {
		stopping, quit = true, nil
		quiet.Reset(2 * fetchWait)
	}
	for {
		free := cap(s.own) - len(s.own) // only this loop adds tokens
		switch pullDecision(free, threshold, outstanding, stopping || paused, p.batches, gathering, gathered) {
		case pullRequest:
			gathering, gathered = false, false
			gather.Stop()
			for range free {
				s.own <- struct{}{}
			}
			if err := p.request(next, inbox, free); err != nil {
				p.giveBack(s, free)
				if p.nc.IsClosed() {
					p.giveBack(s, outstanding)
					return // nothing will come any more
				}
				// Unavailable: a pull while disconnected says so, not
				// "outbound buffer limit exceeded".
				p.log.Warn().Err(jetstream.Unavailable(err)).Str("consumer", info.Name).Msg("cannot pull tasks; retrying")
				select {
				case <-time.After(fetchWait):
				case <-quit:
					stop()
				}
				continue
			}
			outstanding += free
			quiet.Reset(2 * fetchWait)
		case pullGather:
			gathering = true
			gather.Reset(batchDelay)
		}
		if stopping && outstanding == 0 {
			return
		}
		s.turns.Add(1)
		select {
		case m := <-msgs:
			if outstanding > 0 {
				quiet.Reset(2 * fetchWait)
			}
			switch code := m.Header.Get("Status"); code {
			case "":
				backoff = 0
				if outstanding == 0 {
					// A request this loop took for gone delivered after
					// all: it runs if a slot is free, else it goes back.
					select {
					case s.own <- struct{}{}:
					default:
						p.release(pulled{m}, s.h)
						continue
					}
				} else {
					outstanding--
				}
				p.start(s, pulled{m}, stopping)
			case "100": // idle heartbeat
			default:
				// 408 (expired), 409 (leadership change, consumer gone,
				// ...), 404: the rest of a request is not coming.
				n := outstanding
				if v, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); err == nil {
					n = min(v, outstanding)
				}
				outstanding -= n
				p.giveBack(s, n)
				if code != "408" && code != "404" {
					if backoff == 0 {
						p.log.Warn().Str("consumer", info.Name).Str("status", code).Str("description", m.Header.Get("Description")).
							Msg("pull request ended early; pulling again, less often while it keeps ending so")
					}
					backoff = min(max(2*backoff, pullBackoff), fetchWait)
					paused = true
					resume.Reset(backoff)
				}
			}
		case <-resume.C:
			paused = false
		case <-s.freed:
		case <-gather.C:
			gathering, gathered = false, true
		case <-quiet.C:
			// Nothing came for twice a request's life: the requests are
			// gone (a reconnect). Their slots are free again.
			p.giveBack(s, outstanding)
			outstanding = 0
			if stopping {
				return
			}
		case <-quit:
			stop()
		}
	}
}

// pullAction is what the pull loop does before it waits: a row of
// pullDecision's table.
type pullAction int

const (
	// pullWait: send nothing; wait for a message, a freed slot or a timer.
	pullWait pullAction = iota
	// pullRequest: reserve every free slot and ask for that many messages.
	pullRequest
	// pullGather: start waiting batchDelay for more slots to free up.
	pullGather
)

// pullDecision is the pull loop's table, read top to bottom; the first row
// that matches decides. free is the number of slots neither held nor
// requested, outstanding the messages requested and not delivered yet;
// halted is set while the pool stops or the server refuses requests
// (paused); batches whether the pool gathers free slots; gathering that
// the gather timer runs, gathered that it has fired.
//
//	row | condition                                                   | action
//	1   | halted, or no free slot                                     | pullWait
//	2   | at least threshold free (half the slots)                    | pullRequest
//	3   | nothing outstanding, and gathered or not batching            | pullRequest
//	4   | nothing outstanding, not gathering yet                      | pullGather
//	5   | anything else (requests out, or gathering)                  | pullWait
func pullDecision(free, threshold, outstanding int, halted, batches, gathering, gathered bool) pullAction {
	switch {
	case halted || free <= 0:
		return pullWait
	case free >= threshold:
		return pullRequest
	case outstanding == 0 && (gathered || !batches):
		return pullRequest
	case outstanding == 0 && !gathering:
		return pullGather
	}
	return pullWait
}

// pullBackoff is the first pause after a pull request the server ended
// early with an error; each next one doubles it, up to fetchWait.
const pullBackoff = 20 * time.Millisecond

// batchDelay is how long a request for fewer than half of a consumer's
// slots waits, when nothing else is requested, for more of them to free up:
// under load, slots free up a few at a time, and one request then asks for
// many messages instead of one each; a slot held long (a long step) delays
// the request by this much only.
const batchDelay = 5 * time.Millisecond

// giveBack frees n of s's slots reserved for messages that did not come.
func (p *Pool) giveBack(s *source, n int) {
	for range n {
		<-s.own
	}
}

// request asks for n messages, answered on inbox within fetchWait.
func (p *Pool) request(subject, inbox string, n int) error {
	b, err := json.Marshal(struct {
		Batch   int           `json:"batch"`
		Expires time.Duration `json:"expires"`
	}{n, fetchWait})
	if err != nil {
		return err
	}
	err = p.nc.PublishRequest(subject, inbox, b)
	p.lastRequest.Store(time.Now().UnixNano())
	return err
}

// pulled is a message of a pull request as the handlers see it (a
// jetstream.Msg): it is settled by replies to its ack subject.
type pulled struct{ m *nats.Msg }

func (m pulled) Metadata() (*natsjs.MsgMetadata, error) {
	md, err := m.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &natsjs.MsgMetadata{
		Sequence:     natsjs.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}
func (m pulled) Data() []byte         { return m.m.Data }
func (m pulled) Headers() nats.Header { return m.m.Header }
func (m pulled) Subject() string      { return m.m.Subject }
func (m pulled) Reply() string        { return m.m.Reply }
func (m pulled) Ack() error           { return settled(m.m.Ack()) }
func (m pulled) DoubleAck(ctx context.Context) error {
	return settled(m.m.AckSync(nats.Context(ctx)))
}
func (m pulled) Nak() error                             { return settled(m.m.Nak()) }
func (m pulled) NakWithDelay(delay time.Duration) error { return settled(m.m.NakWithDelay(delay)) }
func (m pulled) InProgress() error                      { return settled(m.m.InProgress()) }
func (m pulled) Term() error                            { return settled(m.m.Term()) }
func (m pulled) TermWithReason(reason string) error {
	return settled(m.m.Respond([]byte("+TERM " + reason)))
}

// settled is err with nats.go's legacy "already acknowledged" as the
// jetstream package's, which the handlers match.
func settled(err error) error {
	if errors.Is(err, nats.ErrMsgAlreadyAckd) {
		return natsjs.ErrMsgAlreadyAckd
	}
	return err
}
