package workflow

// Replay checks (check.go): a body replayed in the process against a
// history, without NATS; no server needed.

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/state"
)

// mixed starts one of each: a sequential step, two branches awaited
// together, a sleep and a child, then returns what the steps returned.
func mixed(c *Context, _ json.RawMessage) (json.RawMessage, error) {
	a, err := seqStep(c, "a", ok(`"a"`))
	if err != nil {
		return nil, err
	}
	px, err := c.Start("x", RetryPolicy{}, TaskKey{}, ok(`"x"`))
	if err != nil {
		return nil, err
	}
	py, err := c.Start("y", RetryPolicy{}, TaskKey{}, ok(`"y"`))
	if err != nil {
		return nil, err
	}
	won, err := c.Await([]*Pending{px, py}, true)
	if err != nil {
		return nil, err
	}
	first, err := []*Pending{px, py}[won].Outcome()
	if err != nil {
		return nil, err
	}
	nap, err := c.StartWait("nap", WaitSpec{Kind: state.StepSleep, For: time.Hour})
	if err != nil {
		return nil, err
	}
	if _, err := c.Result(nap); err != nil {
		return nil, err
	}
	kid, err := c.StartChild("kid", ChildSpec{Workflow: "other", Input: json.RawMessage(`{}`)})
	if err != nil {
		return nil, err
	}
	k, err := c.Result(kid)
	if err != nil {
		return nil, err
	}
	return json.Marshal([]json.RawMessage{a, first, k})
}

func histStep(id, output string) state.Step {
	return state.Step{V: state.Version, StepID: id, RunID: "r", Name: state.StepName(id), Attempt: 1, Output: json.RawMessage(output)}
}

// A check lists every step the body starts, with its kind and epoch (the
// awaits passed before it), says which the history holds, gives the body
// the history's results (JSON null for the rest), and picks AwaitFirst's
// winner by the history's commit order.
func TestCheckReplaysAgainstAHistory(t *testing.T) {
	t.Parallel()
	def := Definition{Name: wf, Run: mixed}
	hist := CheckRun{Workflow: wf, RunID: "r", Input: json.RawMessage(`{}`), Steps: []state.Step{
		histStep("r.a.0", `"A"`), histStep("r.y.0", `"Y first"`), histStep("r.x.0", `"X second"`),
	}}
	res := Check(def, hist, 100, 10*time.Second)
	require.True(t, res.Returned, "%+v", res)
	require.NoError(t, res.Err)
	require.JSONEq(t, `["A","Y first",null]`, string(res.Output))
	want := []CheckStart{
		{Seq: 0, StepID: "r.a.0", Name: "a", Kind: CheckKindStep, Epoch: 0, Known: true},
		{Seq: 1, StepID: "r.x.0", Name: "x", Kind: CheckKindStep, Epoch: 1, Known: true},
		{Seq: 2, StepID: "r.y.0", Name: "y", Kind: CheckKindStep, Epoch: 1, Known: true},
		{Seq: 3, StepID: "r.nap.0", Name: "nap", Kind: state.StepSleep, Epoch: 2},
		{Seq: 4, StepID: "r.kid.0", Name: "kid", Kind: CheckKindChild, Epoch: 3, Child: state.ChildRunID("r", 0, "kid", 0)},
	}
	require.Equal(t, want, res.Started)
	require.Equal(t, res, Check(def, hist, 100, 10*time.Second), "a repeat check differs")
}

// A check stops a body past its step limit, reports a panic, and gives up
// on a body that does not return within its timeout (cancelling the
// body's context).
func TestCheckBounds(t *testing.T) {
	t.Parallel()
	run := CheckRun{Workflow: wf, RunID: "r", Input: json.RawMessage(`{}`)}
	res := Check(Definition{Name: wf, Run: mixed}, run, 2, 10*time.Second)
	require.True(t, res.Bounded)
	require.False(t, res.Returned)
	require.Len(t, res.Started, 2)

	res = Check(Definition{Name: wf, Run: func(*Context, json.RawMessage) (json.RawMessage, error) { panic("boom") }}, run, 10, 10*time.Second)
	require.True(t, res.Panicked)
	require.ErrorContains(t, res.Err, "boom")

	res = Check(Definition{Name: wf, Run: func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		<-c.Context().Done()
		return nil, c.Context().Err()
	}}, run, 10, 20*time.Millisecond)
	require.True(t, res.TimedOut)
	require.Nil(t, res.Started)

	res = Check(Definition{Name: wf, Run: func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return nil, errors.New("refused")
	}}, run, 10, 10*time.Second)
	require.True(t, res.Returned)
	require.EqualError(t, res.Err, "refused")
}

// CheckKind names a record's kind as a check does.
func TestCheckKind(t *testing.T) {
	t.Parallel()
	require.Equal(t, CheckKindStep, CheckKind(state.Step{}))
	require.Equal(t, CheckKindChild, CheckKind(state.Step{Child: "c"}))
	require.Equal(t, state.StepEvent, CheckKind(state.Step{Kind: state.StepEvent}))
}
