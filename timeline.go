package jetflow

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// OpenStep is a step of a run that has started more than once, or failed
// and waits to be retried, and has not committed a result: what an
// operator looks at while a step struggles. A step that runs for the
// first time is not open yet (nothing is written for it until it
// commits).
type OpenStep struct {
	StepID string `json:"step_id"`
	Name   string `json:"name"`
	// Attempt is the latest attempt started.
	Attempt int `json:"attempt"`
	// Attempts are its failed attempts, oldest first (the last ten).
	Attempts []StepAttempt `json:"attempts,omitempty"`
}

// OpenSteps lists the steps of runID's current generation that have an
// attempt log but no committed result, in step ID order. It reads the
// run's attempt logs (one key listing) and checks each against the steps
// bucket, so it is an operator's read, like Steps.
func (c *Client) OpenSteps(ctx context.Context, runID string) (_ []OpenStep, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return nil, err
	}
	identity := c.identity(ctx, runID)
	lister, err := c.assets.Attempts.Raw().ListKeysFiltered(ctx, identity+".>")
	if err != nil {
		return nil, fmt.Errorf("jetflow: list attempts of %s: %w", runID, err)
	}
	out := []OpenStep{}
	for key := range lister.Keys() {
		if strings.TrimPrefix(key, identity+".") == "start" {
			continue // the start task's deliveries, not a step
		}
		_, _, err := c.assets.Steps.Get(ctx, key)
		if err == nil {
			continue // committed: Steps shows it
		}
		if !errors.Is(err, jetstream.ErrNotFound) {
			return nil, err
		}
		v, _, err := c.assets.Attempts.Get(ctx, key)
		if errors.Is(err, jetstream.ErrNotFound) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, err
		}
		l, err := state.DecodeAttemptLog(v)
		if err != nil {
			return nil, fmt.Errorf("step %s: %w", key, err)
		}
		out = append(out, OpenStep{StepID: key, Name: state.StepName(key), Attempt: l.Started, Attempts: toAttempts(l.Failures)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StepID < out[j].StepID })
	return out, nil
}
