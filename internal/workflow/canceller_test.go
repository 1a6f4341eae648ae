package workflow

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
)

// The one cancel path, as the executor uses it for a cancelled parent's
// child: the child is written cancelled, its end counted, its parent's
// step committed with the cancel, the workers' notice published, and its
// own attached child cancelled the same way; a detached grandchild is
// left running. A repeat finds it cancelled and cancels nothing more.
func TestCancellerCancelsTheWholeAttachedTree(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2*time.Second)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	notices := make(chan *nats.Msg, 8)
	sub, err := r.nc.ChanSubscribe(jetstream.CancelSubjectPrefix+">", notices)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	now := time.Now().UTC()
	run := func(id, token string, parent *state.Run, children ...state.ChildLink) state.Run {
		rec := state.Run{V: state.Version, RunID: id, Workflow: wf, Input: json.RawMessage(`1`), Status: state.StatusRunning,
			Token: token, Exec: state.ExecLease, CreatedAt: now, UpdatedAt: now, Children: children}
		if parent != nil {
			rec.Parent = &state.ParentLink{RunID: parent.RunID, Workflow: wf, Token: parent.Token, StepID: parent.RunID + ".kid.0", Seq: 1}
		}
		_, err := r.store.Create(r.ctx(), rec)
		require.NoError(t, err)
		return rec
	}
	parent := run("p-1", "tp", nil, state.ChildLink{RunID: "c-1", Workflow: wf, StepID: "p-1.kid.0"})
	child := run("c-1", "tc", &parent, state.ChildLink{RunID: "g-1", Workflow: wf, StepID: "c-1.kid.0"},
		state.ChildLink{RunID: "d-1", Workflow: wf, StepID: "c-1.kid.0", Detached: true})
	run("g-1", "tg", &child)
	run("d-1", "td", &child)

	x := NewCanceller(r.a, r.store, m, nil, false)
	out, err := x.Cancel(r.ctx(), "c-1")
	require.NoError(t, err)
	require.False(t, out.Already)
	require.Equal(t, []string{"g-1"}, out.Children, "the attached grandchild, not the detached one")
	for id, want := range map[string]state.Status{"c-1": state.StatusCancelled, "g-1": state.StatusCancelled, "d-1": state.StatusRunning, "p-1": state.StatusRunning} {
		got, _ := r.runRecord(id)
		require.Equal(t, want, got.Status, id)
	}
	require.Equal(t, 2.0, cancelledCount(t, reg), "each end counted once")
	step := r.step("p-1.kid.0")
	require.NotNil(t, step, "the parent's step holds the child's end")
	require.NotNil(t, step.Error)
	require.Equal(t, KindChildCancelled, step.Error.Kind)
	got := map[string]string{}
	for range 2 {
		msg := await(r, notices, "a cancel notice")
		got[msg.Subject] = string(msg.Data)
	}
	require.Equal(t, map[string]string{jetstream.CancelSubjectPrefix + "c-1": "tc", jetstream.CancelSubjectPrefix + "g-1": "tg"}, got)

	again, err := x.Cancel(r.ctx(), "c-1")
	require.NoError(t, err)
	require.True(t, again.Already)
	require.Equal(t, 2.0, cancelledCount(t, reg), "a repeat counts nothing")

	_, err = x.Cancel(r.ctx(), "nope")
	require.ErrorIs(t, err, ErrRunNotFound)
}

// cancelledCount is jetflow_runs_finished_total{state="cancelled"} in reg.
func cancelledCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != metrics.NameRunsFinished {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == string(state.StatusCancelled) {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
