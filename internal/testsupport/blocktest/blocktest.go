// Package blocktest makes blocked runs for the tests of the surfaces that
// show and unblock them (the HTTP API, the producer command, the web
// inspector): a workflow whose code a test changes under one of its runs,
// as a deploy would, so that the run's replay diverges from its history
// and its worker blocks it (jetflow.StatusBlocked, Run.Block).
package blocktest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// The "signup" workflow: a step (First, or Renamed under the changed
// code), a wait for the event Event, then the step Last.
const (
	Workflow = "signup"
	First    = "send-welcome"
	Renamed  = "send-welcome-email"
	Event    = "confirmed"
	Last     = "activate"
)

// Build is the build identity the workers of these tests give themselves
// (jetflow.WorkerConfig.Build): the build a block names.
const Build = "build-2"

// Code is the code of "signup" as its worker runs it: for a run the test
// renamed (Block), or for every run in NewRenamed's code, the first step
// is Renamed, else First. It counts each step's side effects by step ID.
// Safe for concurrent use.
type Code struct {
	mu      sync.Mutex
	all     bool
	renamed map[string]bool
	effects map[string]int
}

// New returns the code of "signup", with no run renamed.
func New() *Code { return &Code{renamed: map[string]bool{}, effects: map[string]int{}} }

// NewRenamed returns the code of "signup" after a deploy that renamed its
// first step: Renamed in every run. Its replay of a run that committed
// First (Park) diverges at place 0.
func NewRenamed() *Code {
	c := New()
	c.all = true
	return c
}

// Workflow is "signup" over c, to register with the test's worker (whose
// WorkerConfig.Build should be Build).
func (c *Code) Workflow() *jetflow.Workflow[string, string] {
	effect := func(ctx context.Context) (string, error) {
		d, _ := jetflow.StepDetailsFrom(ctx)
		c.mu.Lock()
		c.effects[d.StepID]++
		c.mu.Unlock()
		return "sent", nil
	}
	return jetflow.NewWorkflow(Workflow, func(ctx *jetflow.Context, name string) (string, error) {
		first := First
		if c.isRenamed(ctx.RunID()) {
			first = Renamed
		}
		if _, err := jetflow.Step(ctx, first, effect); err != nil {
			return "", err
		}
		if _, err := jetflow.WaitEvent[string](ctx, Event); err != nil {
			return "", err
		}
		return jetflow.Step(ctx, Last, effect)
	}, jetflow.WithEvent[string](Event))
}

func (c *Code) isRenamed(runID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all || c.renamed[runID]
}

// Restore gives runID's run the code it ran first (a rollback): its
// replay then passes the place it was blocked at. (Not for NewRenamed's
// code, which renames every run.)
func (c *Code) Restore(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.renamed, runID)
}

// Effects is how often the step stepID ran.
func (c *Code) Effects(stepID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.effects[stepID]
}

// Park starts a run of "signup" under runID through client and waits until
// it has committed its first step and waits for its event: a run in
// flight whose history has First at place 0, parked (no worker holds it).
func (c *Code) Park(t testing.TB, client *jetflow.Client, runID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := client.StartByName(ctx, Workflow, json.RawMessage(`"ann"`), jetflow.WithRunID(runID))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		d, err := client.Describe(ctx, runID)
		return err == nil && len(d.Steps) == 1 && len(d.Waits) == 1
	}, 30*time.Second, 10*time.Millisecond, "run %s did not reach its wait", runID)
}

// Block parks a run of "signup" under runID (Park), renames the first
// step for it (a deploy that renamed the step), and sends the event: the
// worker's replay meets the renamed step where the history has First, and
// blocks the run. It returns the blocked run, whose block is a rename at
// place 0 (History: First, Code: Renamed).
func (c *Code) Block(t testing.TB, client *jetflow.Client, runID string) jetflow.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.Park(t, client, runID)
	c.mu.Lock()
	c.renamed[runID] = true
	c.mu.Unlock()
	_, err := client.SendEvent(ctx, runID, Event, runID+"-confirmed", json.RawMessage(`"yes"`))
	require.NoError(t, err)
	var run jetflow.Run
	require.Eventually(t, func() bool {
		run, err = client.GetRun(ctx, runID)
		return err == nil && run.Status == jetflow.StatusBlocked
	}, 30*time.Second, 10*time.Millisecond, "run %s was not blocked", runID)
	require.NotNil(t, run.Block)
	require.NotNil(t, run.Block.Divergence)
	return run
}

// StepID is the step ID of runID's step name (its first occurrence).
func StepID(runID, name string) string { return runID + "." + name + ".0" }
