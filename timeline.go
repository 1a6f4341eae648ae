package jetflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// OpenSteps lists the steps of runID's current generation that have
// failed at least once, or started more than once, and have no committed
// result, in step ID order. It reads the run's attempt logs (one key
// listing) and checks each against the steps bucket, so it is an
// operator's read, like Steps.
func (c *Client) OpenSteps(ctx context.Context, runID string) (_ []OpenStep, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return nil, err
	}
	return c.openSteps(ctx, runID, c.identity(ctx, runID))
}

// openSteps is OpenSteps of the generation whose records are keyed by
// identity.
func (c *Client) openSteps(ctx context.Context, runID, identity string) ([]OpenStep, error) {
	lister, err := c.assets.Attempts.Raw().ListKeysFiltered(ctx, identity+".>")
	if err != nil {
		return nil, fmt.Errorf("jetflow: list attempts of %s: %w", runID, err)
	}
	out := []OpenStep{}
	for key := range lister.Keys() {
		if state.IsWaitKey(key) || key == state.RerunCopiedKey(identity) {
			continue // a wait's record (OpenWaits), or a rerun's note: not an attempt log
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
			return nil, fmt.Errorf("attempt log %s: %w", key, err)
		}
		for _, o := range openIn(key, strings.TrimPrefix(key, identity+".") == "start", l) {
			_, _, err := c.assets.Steps.Get(ctx, o.StepID)
			if err == nil {
				continue // committed: Steps shows it
			}
			if !errors.Is(err, jetstream.ErrNotFound) {
				return nil, err
			}
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StepID < out[j].StepID })
	return out, nil
}

// openIn is what the attempt log l under key says of steps: the log of a
// step's own task (key is its step ID) stands for that step; the log of a
// run's start task (start) for the steps it ran itself, named by their
// failures.
func openIn(key string, start bool, l state.AttemptLog) []OpenStep {
	if !start {
		return []OpenStep{{StepID: key, Name: state.StepName(key), Attempt: l.Started, Attempts: toAttempts(l.Failures)}}
	}
	var out []OpenStep
	for _, f := range l.Failures {
		if f.StepID == "" {
			continue
		}
		i := slices.IndexFunc(out, func(o OpenStep) bool { return o.StepID == f.StepID })
		if i < 0 {
			out = append(out, OpenStep{StepID: f.StepID, Name: state.StepName(f.StepID)})
			i = len(out) - 1
		}
		out[i].Attempts = append(out[i].Attempts, toAttempts([]state.AttemptFailure{f})...)
		out[i].Attempt = max(out[i].Attempt, f.Attempt, l.Started)
	}
	return out
}
