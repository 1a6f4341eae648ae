package workflow

// What moves a parked run on from outside its holder: due timers
// forwarded into the task stream (DueForwarder), and a child's end told to
// its parent (ParentNotifier), directly or through a worker.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// A due run timer is published as a wake on the run's subject under the
// message ID it carries; while the subject still holds a task (a holder
// at work) it is not absorbed but tried again, and lands once the task is
// gone. A malformed due timer is terminated.
func TestDueForwarderWaitsForThePendingTask(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	run, rev := r.createRun("r", nil)
	// A holder at work: its task is stored on the run's subject.
	pending := r.publish(jetstream.RunSubject(wf, "r"), "r", state.Task{RunID: "r", Workflow: wf, Token: run.Token, Exec: state.ExecLease})
	task := state.StepTask(run, rev, "r.nap.0")
	task.Wake, task.WakeAt = true, r.clock.Now().Add(time.Minute).UTC()
	b, err := state.Encode(task)
	require.NoError(t, err)
	due := r.clock.Now().Add(time.Minute)
	require.NoError(t, jetstream.ScheduleTimer(r.ctx(), r.a.JS, jetstream.RunTimer(wf, "r.nap.0"), "r.nap.0#wake", b, due, due))
	r.serveTimers()
	require.Equal(t, 1, r.fireDue(time.Minute))

	// The forwarder meets the pending task: nothing is published over it.
	r.eventually(func() bool { return len(r.tap.published("jetflow.run.")) >= 2 }, "the due timer was not forwarded")
	got, seq, ok := r.pending(jetstream.RunSubject(wf, "r"))
	require.True(t, ok)
	require.Equal(t, pending, seq, "the due timer replaced the pending task")
	require.False(t, got.Wake)

	require.NoError(t, r.a.Tasks.DeleteMsg(r.ctx(), pending)) // the holder's task settled
	r.eventually(func() bool { task, _, ok := r.pending(jetstream.RunSubject(wf, "r")); return ok && task.Wake },
		"the due timer was lost to the pending task")
	wake, _, _ := r.pending(jetstream.RunSubject(wf, "r"))
	require.Equal(t, "r.nap.0", wake.StepID)
	require.Equal(t, task.WakeAt, wake.WakeAt)
	last := r.tap.published("jetflow.run.")
	require.Equal(t, "r.nap.0#wake", last[len(last)-1].Header.Get("Nats-Msg-Id"))
	r.eventually(func() bool { return len(r.timers()) == 0 }, "the forwarded timer is still stored")

	// A due message that is no timer is terminated, not retried.
	_, err = r.a.JS.Publish(r.ctx(), "jetflow.fire.run.w.garbage", []byte("{"))
	require.NoError(t, err)
	r.eventually(func() bool {
		has, err := jetstream.HasMessages(r.ctx(), r.a.Timers, "jetflow.fire.>")
		return err == nil && !has
	}, "the malformed due timer was not terminated")
}

// A child's end told to its parent: the parent's step is committed with
// the child's outcome (create-if-absent: a repeat changes nothing) and the
// parent is woken — by a wake from a worker, or, from a client (ViaBranch,
// which may not publish run tasks), by a branch task of the step under
// <step-id>.notify, whose worker finds the step committed and wakes the
// parent.
func TestParentNotifier(t *testing.T) {
	t.Parallel()
	for _, viaBranch := range []bool{false, true} {
		t.Run(map[bool]string{false: "wake", true: "via a branch task"}[viaBranch], func(t *testing.T) {
			t.Parallel()
			r := newRig(t, time.Second)
			parent, _ := r.createRun("r", nil)
			r.putLease("r", state.Lease{State: state.LeaseParked, Seq: 999, Delivered: 1, Epoch: 1, Waits: []string{"r.kid.0"}})
			child := state.Run{V: state.Version, RunID: "kid-run", Workflow: wf, Status: state.StatusCompleted,
				Output: json.RawMessage(`"done"`), Token: "child-tok",
				Parent: &state.ParentLink{RunID: "r", Workflow: wf, Token: parent.Token, StepID: "r.kid.0", Seq: 3}}
			n := ParentNotifier{Assets: r.a, Runs: r.store, Now: time.Now, ViaBranch: viaBranch}
			require.NoError(t, n.Notify(r.ctx(), child))
			rec := r.step("r.kid.0")
			require.NotNil(t, rec)
			require.Equal(t, "kid-run", rec.Child)
			require.JSONEq(t, `"done"`, string(rec.Output))
			require.Equal(t, 3, rec.Seq)

			// A repeat (the child's task redelivered) commits nothing new.
			child.Output = json.RawMessage(`"other"`)
			require.NoError(t, n.Notify(r.ctx(), child))
			require.JSONEq(t, `"done"`, string(r.step("r.kid.0").Output))

			if !viaBranch {
				wakes := r.tap.published("jetflow.run.")
				require.NotEmpty(t, wakes)
				require.Equal(t, "r.kid.0.wake", wakes[0].Header.Get("Nats-Msg-Id"))
				require.Empty(t, r.tap.published("jetflow.branch."))
				return
			}
			require.Empty(t, r.tap.published("jetflow.run."), "a client published a run task")
			notes := r.tap.published("jetflow.branch.")
			require.NotEmpty(t, notes)
			require.Equal(t, "r.kid.0.notify", notes[0].Header.Get("Nats-Msg-Id"))
			require.True(t, r.tap.tasks(notes)[0].Redispatched)
			// A worker takes the branch task, finds the step committed and
			// wakes the parked parent.
			r.serveCounted(r.executor("w1", noBody, nil), 1, false, true)
			r.acked(jetstream.BranchSubject(wf, "r.kid.0"))
			wake, _, ok := r.pending(jetstream.RunSubject(wf, "r"))
			require.True(t, ok, "the parent was not woken")
			require.True(t, wake.Wake)
			require.Equal(t, "r.kid.0", wake.StepID)
		})
	}
}
