package workflow

// Nothing that changes nothing wakes a run: what a start task is to its
// run (startRole), what a stray start task's delivery does, and when a
// repeated event wakes the run (Sender.wakeMissing).

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// The decision table of startRole: for each kind of run task and each
// state of the run's lease as the task's delivery read it, what the task
// is to the run.
func TestStartRole(t *testing.T) {
	t.Parallel()
	run := state.Run{RunID: "r", Token: "own", Status: state.StatusRunning, Exec: state.ExecLease}
	const seq = 10
	parkedBy := func(s uint64) *state.Lease {
		return &state.Lease{State: state.LeaseParked, Seq: s, Waits: []string{"r.a.0"}}
	}
	start := state.Task{RunID: "r", Token: "own"}
	foreign := state.Task{RunID: "r", Token: "duplicate"}
	wake := state.Task{RunID: "r", Token: "own", Wake: true}
	for _, tc := range []struct {
		name      string
		task      state.Task
		delivered int
		lease     *state.Lease
		want      taskRole
	}{
		{"a wake, whatever the lease says", wake, 1, parkedBy(3), roleWake},
		{"a wake of a run never held", wake, 1, nil, roleWake},
		{"the run's own start task, first delivery, run never held: fresh", start, 1, nil, roleFresh},
		{"the run's own start task redelivered, no lease written: its first delivery may have run steps", start, 2, nil, roleHold},
		{"the run's own start task redelivered after its own park", start, 2, parkedBy(seq), roleHold},
		{"the run's own start task published late, the run parked by a wake: stray", start, 1, parkedBy(3), roleStray},
		{"a duplicate's start task, the run parked: stray", foreign, 1, parkedBy(3), roleStray},
		{"a duplicate's start task redelivered, the run parked: stray", foreign, 2, parkedBy(3), roleStray},
		{"a start task of another token, run never held: the run's only task (its publisher died before the record)", foreign, 1, nil, roleHold},
		{"a start task finding the lease held by another message (that message was lost): takes over", foreign, 1,
			&state.Lease{State: state.LeaseHeld, Seq: 3}, roleHold},
		{"a start task finding the lease released by another message", start, 1, &state.Lease{State: state.LeaseReleased, Seq: 3}, roleHold},
		{"a start task finding the lease cancelled: hold drops it", foreign, 1, &state.Lease{State: state.LeaseCancelled}, roleHold},
		{"a start task finding its own message's hand-back", start, 2, &state.Lease{State: state.LeaseReleased, Seq: seq, Unstarted: true}, roleHold},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, startRole(tc.task, run, seq, tc.delivered, tc.lease))
		})
	}
	// A run taken over from the executor before the lease committed its
	// steps without one: its own start task (a duplicate start's repair)
	// reads the history.
	adopted := run
	adopted.Adopted = true
	require.Equal(t, roleHold, startRole(start, adopted, seq, 1, nil), "an adopted run's start task is never its fresh start")
}

// A stray start task stored while the run is parked is acknowledged
// without a replay. It absorbed every wake published while it was stored:
// when what the run is parked on was committed meanwhile (its committer's
// wake absorbed), the stray's delivery wakes the run after its
// acknowledgement (message ID <identity>.stray.<seq>); when nothing was,
// it publishes nothing and writes nothing.
func TestStrayStartTaskIsDroppedAndLooksAtTheAwait(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{false, true} {
		t.Run("committed="+strconv.FormatBool(committed), func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			hk := newHooked()
			replays := make(chan struct{}, 16)
			e := r.executor("w1", func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
				replays <- struct{}{}
				p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: "go"})
				if err != nil {
					return nil, err
				}
				return c.Result(p)
			}, hk.install)
			// The run parked on its event by a task gone since.
			run, _ := r.createRun("r", nil)
			wait := state.StepID("r", state.EventStepName("go"), 0)
			leaseRev := r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 1, Waits: []string{wait}})
			seq := r.publish(jetstream.RunSubject(wf, "r"), "r", state.Task{RunID: "r", Workflow: wf, Input: run.Input, Token: "a-duplicate"})
			if committed {
				r.commitStep("r", wait, `"went"`) // its wake absorbed by the stray
			}
			served := r.serveCounted(e, 1, true, false)
			await(r, served.runs.handled, "the stray's delivery")
			if !committed {
				require.Empty(t, r.tap.published("jetflow.run." + wf + ".r")[1:], "the stray's delivery published a task")
				never(r, replays, r.ackWait, "the stray start task replayed the body")
				_, rev := r.lease("r")
				require.Equal(t, leaseRev, rev, "the lease was written")
				_, _, pending := r.pending(jetstream.RunSubject(wf, "r"))
				require.False(t, pending, "the stray is still stored")
				return
			}
			end := r.wait("r")
			require.Equal(t, state.StatusCompleted, end.Status)
			require.JSONEq(t, `"went"`, string(end.Output))
			ids := msgIDs(r.tap.published("jetflow.run." + wf + ".r"))
			require.Equal(t, []string{"r", "r.stray." + strconv.FormatUint(seq, 10)}, ids)
			require.Len(t, replays, 1, "one replay: the stray's wake")
		})
	}
}

// commitEvent commits event eventID with payload into wait step id of run
// runID, as a sender does (create-if-absent).
func (r *rig) commitEvent(runID, id, eventID, payload string) {
	r.t.Helper()
	b, err := state.Encode(state.Step{V: state.Version, StepID: id, RunID: runID, Name: state.StepName(id), Attempt: 1,
		Output: json.RawMessage(payload), Committed: time.Now().UTC(), EventID: eventID, Kind: state.StepEvent})
	require.NoError(r.t, err)
	_, err = r.a.Steps.Create(r.ctx(), id, b)
	require.NoError(r.t, err)
}

// A repeat of a delivered event wakes the run only when the first
// delivery's wake may be missing: the run parked on an await the event
// decides, and no run task stored that replays the body.
func TestRepeatedEventWakesOnlyARunStillWaitingForIt(t *testing.T) {
	t.Parallel()
	ev := state.StepID("r", state.EventStepName("go"), 0)
	other := state.StepID("r", state.EventStepName("other"), 0)
	parked := func(all bool, waits ...string) func(r *rig) {
		return func(r *rig) {
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 1, Waits: waits, All: all})
		}
	}
	task := func(t state.Task) func(r *rig) {
		return func(r *rig) {
			t.RunID, t.Workflow, t.Input = "r", wf, json.RawMessage(`{}`)
			if t.Token == "" {
				t.Token = "tok-r"
			}
			r.publish(jetstream.RunSubject(wf, "r"), "t", t)
		}
	}
	for _, tc := range []struct {
		name  string
		setup []func(r *rig)
		exec  int // the run's Exec (0: an earlier version's)
		want  bool
	}{
		{"parked on the event, no task: its sender died before the wake", []func(*rig){parked(false, ev)}, state.ExecLease, true},
		{"parked on the event or another, no task", []func(*rig){parked(false, other, ev)}, state.ExecLease, true},
		{"parked on the event, a wake stored", []func(*rig){parked(false, ev), task(state.Task{Wake: true})}, state.ExecLease, false},
		{"parked on the event, a stray start task stored", []func(*rig){parked(false, ev), task(state.Task{Token: "dup"})}, state.ExecLease, true},
		{"parked on the event and another, the other missing", []func(*rig){parked(true, ev, other)}, state.ExecLease, false},
		{"parked on the event and another, both committed", []func(*rig){parked(true, ev, other), func(r *rig) { r.commitStep("r", other, `1`) }}, state.ExecLease, true},
		{"parked elsewhere", []func(*rig){parked(false, other)}, state.ExecLease, false},
		{"held", []func(*rig){func(r *rig) { r.putLease("r", state.Lease{State: state.LeaseHeld, Seq: 999}) }}, state.ExecLease, false},
		{"never held", nil, state.ExecLease, false},
		{"a run of an earlier version's executor", nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			run, rev := r.createRun("r", func(run *state.Run) { run.Exec = tc.exec })
			r.commitEvent("r", ev, "e1", `1`)
			for _, f := range tc.setup {
				f(r)
			}
			s := Sender{Assets: r.a, Runs: r.store, Now: time.Now}
			need, err := s.wakeMissing(r.ctx(), Target{Run: run, Rev: rev, Name: "go"}, ev)
			require.NoError(t, err)
			require.Equal(t, tc.want, need)
		})
	}
}

// The sender that dies between its commit and its wake leaves the run
// parked on the event: a repeat of the event (the sender's retry, or a
// provider's redelivery) is a duplicate and wakes it, and the run goes on.
func TestRepeatedEventRepairsASenderThatDiedBeforeItsWake(t *testing.T) {
	t.Parallel()
	r, hk, first := waitingForPaid(t)
	r.commitEvent("r", first, "e1", `1`) // the sender died here

	s := Sender{Assets: r.a, Runs: r.store, Now: time.Now}
	ev := Event{RunID: "r", Name: "paid", ID: "e1", Payload: json.RawMessage(`1`)}
	target, err := s.Resolve(r.ctx(), ev)
	require.NoError(t, err)
	d, err := s.Deliver(r.ctx(), target, ev)
	require.NoError(t, err)
	require.True(t, d.Duplicate)
	second := state.StepID("r", state.EventStepName("paid"), 1)
	require.Equal(t, []string{second}, await(r, hk.parks, "the second wait's park"), "the repeat woke the run")

	// A repeat now finds the run parked elsewhere: no wake.
	before := len(r.tap.published("jetflow.run."))
	d, err = s.Deliver(r.ctx(), target, ev)
	require.NoError(t, err)
	require.True(t, d.Duplicate)
	require.Len(t, r.tap.published("jetflow.run."), before, "a repeat woke a run parked elsewhere")
}
