package jetflow

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
)

// A worker of this version executes nothing beside a live worker of another
// engine protocol: it does not start while one is live, and one that joins
// later pauses it (its tasks are handed back, Ready fails) until it leaves.
// The foreign worker is its liveness record, as a worker of the previous
// version writes it (no protocol field).
func TestEngineGate(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("gated", effects)
	cfg := WorkerConfig{LivenessTTL: time.Second, Topology: env.topo}
	first := env.worker(cfg, wf)
	ctx := ctxT(t, time.Minute)
	kv, err := jetstream.LookupWorkflows(ctx, env.conn(), env.topo)
	require.NoError(t, err)
	require.NotNil(t, kv)

	// An earlier version's worker: a liveness record without a protocol,
	// rewritten every half second while it "runs".
	old := func(beat time.Time) []byte {
		b, err := json.Marshal(roster.Live{Workflow: "gated", Worker: "old-worker", Since: beat, Beat: beat})
		require.NoError(t, err)
		return b
	}
	key := roster.LiveKey("gated", "oldid")
	_, err = kv.CreateTTL(ctx, key, old(time.Now()), 10*time.Second)
	require.NoError(t, err)

	second, err := NewWorker(env.conn(), mustRegistry(t, wf), cfg)
	require.NoError(t, err)
	err = second.Start(ctx)
	var mismatch *EngineMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.ErrorIs(t, err, ErrEngineMismatch)
	require.Equal(t, "old-worker", mismatch.Workers[0].Name)
	require.Equal(t, 0, mismatch.Workers[0].Protocol)

	// The running worker pauses: Ready says why, and a run is not executed.
	require.Eventually(t, func() bool { return errors.Is(first.Ready(ctx), ErrEngineMismatch) }, 10*time.Second, 10*time.Millisecond)
	c := env.client()
	h, err := Start(ctx, c, wf, 1, WithRunID("paused-1"))
	require.NoError(t, err)
	require.Never(t, func() bool { return effects.get("paused-1.a.0") > 0 }, 2*time.Second, 50*time.Millisecond,
		"a step ran beside a worker of another protocol")

	// A record whose time says its worker is gone (a withdrawal undone by
	// an unclean stop of the server) does not count.
	_, err = kv.Put(ctx, key, old(time.Now().Add(-time.Hour)))
	require.NoError(t, err)
	got, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, got)
	require.NoError(t, first.Ready(ctx))
	require.NoError(t, second.Start(ctx), "no live worker of another protocol is left")
	stopAtEnd(t, second, 10*time.Second)
}

func mustRegistry(t *testing.T, wfs ...Registrable) *Registry {
	t.Helper()
	r := NewRegistry()
	require.NoError(t, r.Register(wfs...))
	return r
}

// EngineStatus counts the live workers by protocol, names the foreign
// ones, and counts what the executor before the lease still has to do:
// its running runs (records without exec) and its stored tasks.
func TestEngineStatus(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := threeSteps("st", newCounter())
	env.worker(WorkerConfig{Topology: env.topo}, wf)
	c := env.client()
	ctx := ctxT(t, time.Minute)
	s, err := c.EngineStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, EngineStatus{Protocol: EngineProtocol, Workers: map[string]int{"3": 1}, Foreign: []ForeignWorker{},
		Builds: map[string]map[string]int{}}, s)
	require.True(t, s.Ready())
	require.True(t, s.OldWorkDone())

	// An earlier version's worker, one of its running runs and a task.
	beat := time.Now()
	b, err := json.Marshal(roster.Live{Workflow: "st", Worker: "old", Since: beat, Beat: beat})
	require.NoError(t, err)
	_, err = c.assets.Workflows.CreateTTL(ctx, roster.LiveKey("st", "oldid"), b, 10*time.Second)
	require.NoError(t, err)
	_, err = c.assets.Runs.Create(ctx, "legacy-1", []byte(`{"v":1,"run_id":"legacy-1","workflow":"st","input":1,"status":"running","token":"t"}`))
	require.NoError(t, err)
	_, err = c.assets.JS.Publish(ctx, "jetflow.task.st.legacy-1", []byte(`{}`))
	require.NoError(t, err)
	s, err = c.EngineStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"3": 1, "0": 1}, s.Workers)
	require.Len(t, s.Foreign, 1)
	require.Equal(t, "old", s.Foreign[0].Name)
	require.Equal(t, 1, s.LegacyRuns)
	require.Empty(t, s.Builds, "the legacy run is not counted by build")
	require.Equal(t, uint64(1), s.LegacyMessages)
	require.False(t, s.Ready())
	require.False(t, s.OldWorkDone())
}
