package startproto

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// StartSubjectPrefix is the durable way in: any NATS client publishes a
// start envelope to jetflow.start.<workflow>, with Nats-Msg-Id = run ID,
// through JetStream. Workers admit it with the same code as request-reply
// and the Go SDK. The outcome is read with request-reply or from the run
// record.
const StartSubjectPrefix = jetstream.StartSubjectPrefix

// DurableConfig configures the consumption of durable starts.
type DurableConfig struct {
	// AckWait of the per-workflow start consumers; admission in progress
	// extends it every third.
	AckWait time.Duration
	// ApplyAckWait: see jetstream.ConsumerConfig.
	ApplyAckWait bool
	// Concurrency is how many envelopes of one workflow a worker admits at
	// once (default 4).
	Concurrency int
	// Timeout bounds one admission (default dedupe.DefaultTimeout).
	Timeout time.Duration
	// RetryDelay is the first Nak delay after an infrastructure error; it
	// doubles with each delivery, up to MaxRetryDelay (defaults 1s, 30s).
	RetryDelay, MaxRetryDelay time.Duration
}

func (c DurableConfig) withDefaults() DurableConfig {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.Concurrency < 1 {
		c.Concurrency = 4
	}
	if c.Timeout == 0 {
		c.Timeout = dedupe.DefaultTimeout
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = 30 * time.Second
	}
	return c
}

// settlement is what a durable start's message gets after admission.
type settlement int

const (
	// settleAck: admission decided (created, existing, restarted, or a
	// conflict or rejection recorded on the run's audit).
	settleAck settlement = iota
	// settleTerm: the envelope can never be admitted; redelivering it
	// would give the same answer.
	settleTerm
	// settleRetry: NATS failed; the envelope is delivered again later.
	settleRetry
)

// settle classifies a reply for the durable path.
func settle(r StartReply) settlement {
	if r.Error == nil || errors.Is(r.cause, dedupe.ErrRetryStart) {
		// ErrRetryStart: the envelope's start overlapped its run's whole
		// life (the run was created, ran and expired meanwhile). Admitting
		// it again would create a second run nobody asked for.
		return settleAck
	}
	switch r.Error.Code {
	case CodeConflict, CodeRejected:
		return settleAck
	case CodeInternal:
		return settleRetry
	default: // malformed, invalid run ID, input or policy, too large
		return settleTerm
	}
}

// handleDurableStart admits one envelope from the start stream. Unlike a
// request-reply start, the run ID cannot be generated (a redelivery would
// start a second run): it is the envelope's run_id, else, when the envelope
// has no run_id field, the message's Nats-Msg-Id; when both are given they
// must be equal. A run_id that is "" or null is an invalid run ID, whatever
// the header says.
func handleDurableStart(ctx context.Context, a *dedupe.Admitter, workflow string, wf Served, b []byte, msgID string) StartReply {
	sr, err := parseStartRequest(b)
	if err != nil {
		a.ObserveRefusal("nats", workflow)
		return errorReply(err)
	}
	switch {
	case sr.GenerateRunID:
		a.ObserveRefusal("nats", workflow)
		return errorReply(fmt.Errorf("%w: a durable start cannot have its run ID generated (every redelivery would start another run): set run_id or the Nats-Msg-Id header, or use request-reply", state.ErrInvalidRunID))
	case sr.runIDGiven && sr.RunID == "":
		a.ObserveRefusal("nats", workflow)
		return errorReply(fmt.Errorf("%w: run_id is empty or null", state.ErrInvalidRunID))
	case !sr.runIDGiven && msgID == "":
		a.ObserveRefusal("nats", workflow)
		return errorReply(fmt.Errorf("%w: a durable start needs a run ID: set run_id or the Nats-Msg-Id header", state.ErrInvalidRunID))
	case !sr.runIDGiven:
		sr.RunID = msgID
	case msgID != "" && msgID != sr.RunID:
		a.ObserveRefusal("nats", workflow)
		return errorReply(fmt.Errorf("%w: run_id %q differs from Nats-Msg-Id %q", state.ErrInvalidRunID, sr.RunID, msgID))
	}
	if sr.RerunOf != nil {
		a.ObserveRefusal("nats", workflow)
		return errorReply(fmt.Errorf("%w: rerun_of is for request-reply (jetflow.admit.<workflow>), not a durable start", state.ErrCorrupt))
	}
	req, err := sr.request(workflow, wf.Policy)
	if err != nil {
		a.ObserveRefusal("nats", workflow)
		r := errorReply(err)
		if state.ValidateRunID(sr.RunID) == nil {
			r.RunID = sr.RunID
		}
		return r
	}
	req.Entry = "nats"
	reply, _ := admitEnvelope(ctx, a, wf, req)
	return reply
}

// ServeDurable consumes the start envelopes of the served workflows from
// JETFLOW_STARTS, one durable consumer per workflow shared by all workers,
// and admits each with the same code as Serve. An envelope is acked once
// admission decided, terminated (and logged at error level) when it can
// never be admitted, and handed back with a delay on an infrastructure
// error. stop ends the consuming and waits, until its context ends, for
// admissions in progress; consumers are the start consumers bound (for
// backlog and readiness checks).
func ServeDurable(ctx context.Context, assets *jetstream.Assets, a *dedupe.Admitter, served map[string]Served, cfg DurableConfig, log zerolog.Logger) (stop func(context.Context) error, consumers []natsjs.Consumer, err error) {
	cfg = cfg.withDefaults()
	pool := consume.New(assets.JS.Conn(), cfg.Concurrency*max(len(served), 1), false, log)
	cc := jetstream.ConsumerConfig{AckWait: cfg.AckWait, ApplyAckWait: cfg.ApplyAckWait, MaxAckPending: 16 * cfg.Concurrency,
		Log: func(msg string, kv ...any) { log.Warn().Fields(kv).Msg(msg) }}
	for name, wf := range served {
		c, err := assets.EnsureStartConsumer(ctx, name, cc)
		if err == nil {
			err = pool.Consume(c, cfg.Concurrency, &durable{a: a, cfg: cfg, log: log, workflow: name, wf: wf})
		}
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("jetflow: consume durable starts of %s: %w", name, err), pool.Stop(ctx))
		}
		consumers = append(consumers, c)
	}
	return pool.Stop, consumers, nil
}

// durable admits the durable starts of one workflow (a consume.Handler).
type durable struct {
	a        *dedupe.Admitter
	cfg      DurableConfig
	log      zerolog.Logger
	workflow string
	wf       Served
}

// Handle admits one envelope and settles its message. ctx is cancelled
// when the worker gives up draining: the admission then fails and the
// envelope is delivered again.
func (d *durable) Handle(ctx context.Context, dl *consume.Delivery) {
	msg := dl.Msg
	actx, cancel := context.WithTimeout(tracing.FromNATS(ctx, msg.Headers()), d.cfg.Timeout)
	reply := handleDurableStart(actx, d.a, d.workflow, d.wf, msg.Data(), msg.Headers().Get(nats.MsgIdHdr))
	cancel()

	log := d.log.With().Str("workflow", d.workflow).Str("run_id", reply.RunID).Logger()
	if md, err := msg.Metadata(); err == nil {
		log = log.With().Uint64("stream_seq", md.Sequence.Stream).Uint64("delivered", md.NumDelivered).Logger()
	}
	var err error
	switch settle(reply) {
	case settleAck:
		if reply.Error != nil {
			// Recorded on the run's audit, as for an SDK start.
			log.Warn().Str("code", reply.Error.Code).Str("reason", reply.Error.Message).Msg("durable start refused by admission")
		} else {
			log.Debug().Str("outcome", reply.Outcome).Int64("duplicates", reply.Duplicates).Msg("durable start admitted")
		}
		err = msg.Ack()
	case settleTerm:
		reason := reply.Error.Code + ": " + reply.Error.Message
		if len(reason) > 256 {
			reason = reason[:256]
		}
		log.Error().Str("code", reply.Error.Code).Str("reason", reply.Error.Message).Msg("durable start envelope is invalid: terminated, nothing started")
		err = msg.TermWithReason(reason)
	case settleRetry:
		delay := d.retryDelay(msg)
		log.Warn().Str("reason", reply.Error.Message).Str("retry_in", logging.Duration(delay)).Msg("durable start not admitted, will retry")
		err = msg.NakWithDelay(delay)
	}
	if err != nil && !errors.Is(err, natsjs.ErrMsgAlreadyAckd) {
		// Unsettled: the broker delivers it again after AckWait, and
		// admission is idempotent.
		log.Warn().Err(err).Msg("cannot settle durable start")
	}
}

// Release hands an envelope that was fetched but not admitted back at once.
func (d *durable) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

// retryDelay doubles with each delivery.
func (d *durable) retryDelay(msg natsjs.Msg) time.Duration {
	delay := d.cfg.RetryDelay
	if md, err := msg.Metadata(); err == nil {
		for n := uint64(1); n < md.NumDelivered && delay < d.cfg.MaxRetryDelay; n++ {
			delay *= 2
		}
	}
	return min(delay, d.cfg.MaxRetryDelay)
}
