package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/jetflow/jetflow/internal/eventproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// EventOutcome says what an event delivery did.
type EventOutcome string

const (
	// EventDelivered: the event was recorded in the run for the wait
	// named by EventResult.StepID, which it resumes now or when the body
	// reaches it.
	EventDelivered EventOutcome = "delivered"
	// EventDuplicate: an event with this ID was delivered before, with the
	// same payload; nothing changed.
	EventDuplicate EventOutcome = "duplicate"
)

// EventResult is what SendEvent and Resume report.
type EventResult struct {
	Outcome  EventOutcome
	RunID    string
	Workflow string
	// StepID is the wait step that holds the event.
	StepID  string
	EventID string
	// RunStatus is the state the run ended in, with ErrRunEnded.
	RunStatus RunStatus
}

// SendEvent delivers the event called name, with the ID eventID and the
// JSON payload, to the run runID: to the first of its waits for name
// (WaitEvent, OnEvent) that has no event yet, in the order the body
// starts them. An event sent before the body reaches its wait is kept
// until it does. Sending the same event ID again is a duplicate
// (EventDuplicate) and changes nothing; the same ID with another payload
// is ErrEventConflict.
//
// Errors: ErrRunNotFound, ErrRunEnded, ErrUnknownEvent (the workflow
// declares no such event), ErrEventPayload (it does not decode into the
// declared type), ErrInvalidRunID, ErrInvalidName, ErrInvalidEventID,
// ErrInputTooLarge: none of them stores anything. ErrRunNotFound may
// change once a run started asynchronously is admitted. ErrUnavailable
// (no worker answered, NATS failed, the answer was lost) may or may not
// have delivered the event: send it again with the same event ID, which
// answers EventDuplicate if it had.
func (c *Client) SendEvent(ctx context.Context, runID, name, eventID string, payload json.RawMessage) (EventResult, error) {
	return c.deliver(ctx, eventproto.Request{RunID: runID, Name: name, EventID: eventID, Payload: payload})
}

// Resume delivers an event with the ID eventID and the JSON payload to
// the wait on the hook token (WithHookToken). A hook resumes one wait
// once: the same event again is EventDuplicate, another event (or one
// after the wait timed out) ErrEventConflict. A token no run waits on yet
// is ErrHookNotFound, and nothing is stored. Other errors are SendEvent's.
func (c *Client) Resume(ctx context.Context, token, eventID string, payload json.RawMessage) (EventResult, error) {
	return c.deliver(ctx, eventproto.Request{Token: token, EventID: eventID, Payload: payload})
}

// deliver sends an event request to the workers (eventproto) and decodes
// their reply.
func (c *Client) deliver(ctx context.Context, req eventproto.Request) (_ EventResult, err error) {
	ctx, stop := c.denials.watch(ctx, c.nc, eventproto.SendSubject)
	defer stop()
	defer func() {
		err = deniedErr(ctx, err, "sending events needs a NATS user that may request "+eventproto.SendSubject+" (deploy/nats/accounts.conf)")
	}()
	if len(req.Payload) == 0 {
		req.Payload = json.RawMessage("null")
	}
	if err := req.Event().Validate(); err != nil {
		return EventResult{}, err
	}
	body, err := state.Encode(req)
	if err != nil {
		return EventResult{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	m := nats.NewMsg(eventproto.SendSubject)
	m.Data = body
	// The span in ctx, if any, is the parent of the worker's
	// jetflow.event.deliver span.
	tracing.InjectNATS(ctx, m.Header)
	msg, err := c.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return EventResult{}, fmt.Errorf("%w: no worker is running to deliver the event", ErrUnavailable)
	}
	if err != nil {
		return EventResult{}, fmt.Errorf("%w: deliver event: %w", ErrUnavailable, err)
	}
	var reply eventproto.Reply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return EventResult{}, fmt.Errorf("%w: event reply: %w", ErrMalformed, err)
	}
	res := EventResult{Outcome: EventOutcome(reply.Outcome), RunID: reply.RunID, Workflow: reply.Workflow,
		StepID: reply.StepID, EventID: reply.EventID, RunStatus: RunStatus(reply.RunStatus)}
	if e := reply.Error; e != nil {
		base := eventproto.ErrorOf(e.Code)
		if base == nil {
			return res, fmt.Errorf("%w: event not delivered: %s", ErrUnavailable, e.Message)
		}
		return res, &remoteError{base: base, msg: e.Message}
	}
	return res, nil
}
