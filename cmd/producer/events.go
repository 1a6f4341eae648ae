package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
)

// checkEventID checks the event ID of send and resume: required and not
// empty, so that a script whose ID variable is unset fails instead of
// sending an event that its retry could not be told from.
func (c *cli) checkEventID() error {
	if c.eventID == "" {
		return fmt.Errorf("%s needs --event-id ID: the event's ID, the same on every retry (a second delivery with it is a duplicate)", c.command)
	}
	return nil
}

// eventPayload is the payload --data gives, compacted: JSON null when
// --data is absent or empty.
func eventPayload(data string) (json.RawMessage, error) {
	if data == "" {
		return json.RawMessage("null"), nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(data)); err != nil {
		return nil, fmt.Errorf("invalid JSON for --data: %w", err)
	}
	return compact.Bytes(), nil
}

// sendEvent delivers the event called name, with eventID and the payload
// data, to the run runID (Client.SendEvent) and prints the outcome.
func sendEvent(ctx context.Context, c *jetflow.Client, out *printer, runID, name, eventID, data string) error {
	return deliverEvent(ctx, out, data, func(ctx context.Context, payload json.RawMessage) (jetflow.EventResult, error) {
		return c.SendEvent(ctx, runID, name, eventID, payload)
	})
}

// resumeHook delivers the event with eventID and the payload data to the
// wait on the hook token (Client.Resume) and prints the outcome.
func resumeHook(ctx context.Context, c *jetflow.Client, out *printer, token, eventID, data string) error {
	return deliverEvent(ctx, out, data, func(ctx context.Context, payload json.RawMessage) (jetflow.EventResult, error) {
		return c.Resume(ctx, token, eventID, payload)
	})
}

// deliverEvent decodes data, delivers it with send within opTimeout and
// prints the outcome: a first delivery and a duplicate both succeed. An
// event for a run that has ended is an error matching jetflow.ErrRunEnded.
func deliverEvent(ctx context.Context, out *printer, data string, send func(context.Context, json.RawMessage) (jetflow.EventResult, error)) error {
	payload, err := eventPayload(data)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := send(ctx, payload)
	if errors.Is(err, jetflow.ErrRunEnded) {
		return fmt.Errorf("cannot deliver the event: %w", err)
	}
	if err != nil {
		return err
	}
	return out.event(httpapi.NewEventDelivery(res))
}

// event prints an event's outcome: the HTTP API's body as JSON.
func (p *printer) event(d httpapi.EventDelivery) error {
	if p.json {
		return p.encode(d)
	}
	var err error
	if d.Outcome == jetflow.EventDuplicate {
		_, err = fmt.Fprintf(p.w, "duplicate %s: already delivered to %s (step %s)\n", d.EventID, d.RunID, d.StepID)
	} else {
		_, err = fmt.Fprintf(p.w, "delivered %s to %s (step %s)\n", d.EventID, d.RunID, d.StepID)
	}
	return err
}
