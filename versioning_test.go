package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// signupVersion is the signup workflow of one build: a welcome step, a wait
// for the "confirmed" event, then "activate". patched: the build asks
// Patched("welcome-v2") before the welcome and sends a new welcome step on
// that way.
func signupVersion(effects *counter, patched bool, opts ...WorkflowOption) *Workflow[string, string] {
	effect := func(sctx context.Context) (string, error) {
		info, _ := StepDetailsFrom(sctx)
		effects.inc(info.StepID)
		return "ok", nil
	}
	opts = append(opts, WithEvent[string]("confirmed"))
	if patched {
		opts = append(opts, WithPatch("welcome-v2"))
	}
	return NewWorkflow("signup", func(ctx *Context, in string) (string, error) {
		welcome := "send-welcome"
		if patched && Patched(ctx, "welcome-v2") {
			welcome = "send-welcome-email"
		}
		if _, err := Step(ctx, welcome, effect); err != nil {
			return "", err
		}
		if _, err := WaitEvent[string](ctx, "confirmed"); err != nil {
			return "", err
		}
		return Step(ctx, "activate", effect)
	}, opts...)
}

// A patch: a run that went past the welcome under the code without it
// keeps the old way on every replay under the code with it; a run that
// reaches it under the new code takes the new way, and its marker makes
// every replay answer the same.
func TestPatchedOldRunsKeepTheirWay(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	cfg := func(b string) WorkerConfig {
		return WorkerConfig{Build: b, AckWait: 2 * time.Second, Topology: env.topo}
	}

	w1 := startWorker(t, env.conn(), cfg("v1"), signupVersion(effects, false))
	_, err := c.StartByName(ctx, "signup", json.RawMessage(`"old"`), WithRunID("old"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("old.send-welcome.0") == 1 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, w1.Stop(ctxT(t, 30*time.Second)))

	stopAtEnd(t, startWorker(t, env.conn(), cfg("v2"), signupVersion(effects, true)), 30*time.Second)
	_, err = c.StartByName(ctx, "signup", json.RawMessage(`"new"`), WithRunID("new"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("new.send-welcome-email.0") == 1 }, 30*time.Second, 10*time.Millisecond)
	for _, id := range []string{"old", "new"} {
		_, err = c.SendEvent(ctx, id, "confirmed", "c-"+id, json.RawMessage(`"yes"`))
		require.NoError(t, err)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
	}
	require.Equal(t, map[string]int{
		"old.send-welcome.0": 1, "old.activate.0": 1,
		"new.send-welcome-email.0": 1, "new.activate.0": 1,
	}, effects.snapshot())
	steps, err := c.Steps(ctx, "new")
	require.NoError(t, err)
	kinds := map[string]string{}
	for _, s := range steps {
		kinds[s.StepID] = s.Kind
		if s.Kind != "event" { // an event's record is its sender's
			require.Equal(t, "v2", s.Build, s.StepID)
		}
	}
	require.Equal(t, "patch", kinds["new.patch=welcome-v2.0"], "the new run's marker")
	steps, err = c.Steps(ctx, "old")
	require.NoError(t, err)
	for _, s := range steps {
		require.NotEqual(t, "patch", s.Kind, "the old run took the old way: no marker")
	}
	run, err := c.GetRun(ctx, "old")
	require.NoError(t, err)
	require.Equal(t, "v1", run.Build, "the build that started the old run")
}

// Versioning options and build identities are checked where they are
// set: at registration and when the worker is made; a Patched call with an
// undeclared ID fails its run.
func TestVersioningBadInput(t *testing.T) {
	t.Parallel()
	body := func(ctx *Context, in string) (string, error) { return in, nil }
	for _, tc := range []struct {
		name string
		wf   *Workflow[string, string]
	}{
		{"patch declared twice", NewWorkflow("w", body, WithPatch("p1", "p1"))},
		{"invalid patch ID", NewWorkflow("w", body, WithPatch("p.1"))},
		{"empty patch ID", NewWorkflow("w", body, WithPatch(""))},
		{"unknown versioning", NewWorkflow("w", body, WithVersioning(Versioning(7)))},
	} {
		err := NewRegistry().Register(tc.wf)
		require.ErrorIs(t, err, ErrInvalidVersioning, tc.name)
	}

	env := newEnv(t, Topology{})
	ws := NewRegistry()
	require.NoError(t, ws.Register(NewWorkflow("pinned", body, WithVersioning(Pinned))))
	nc := env.conn()
	_, err := NewWorker(nc, ws, WorkerConfig{Build: "bad build!"})
	require.ErrorIs(t, err, ErrInvalidBuild)
	_, err = NewWorker(nc, ws, WorkerConfig{Build: strings.Repeat("b", 65)})
	require.ErrorIs(t, err, ErrInvalidBuild)
	_, err = NewWorker(nc, ws, WorkerConfig{}) // a test binary has no VCS revision
	require.ErrorIs(t, err, ErrInvalidBuild, "a pinned workflow needs a build identity")
	_, err = NewWorker(nc, ws, WorkerConfig{Build: "v1.2.3+rc_1"})
	require.NoError(t, err)

	typo := NewWorkflow("typo", func(ctx *Context, in string) (string, error) {
		if Patched(ctx, "welcome-v3") {
			return "new", nil
		}
		return "old", nil
	}, WithPatch("welcome-v2"))
	env.worker(WorkerConfig{}, typo)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h, err := Start(ctx, c, typo, "x", WithRunID("typo-1"))
	require.NoError(t, err)
	_, err = h.Result(ctx)
	require.ErrorContains(t, err, ErrUndeclaredPatch.Error())
}

// Pinned runs stay on the build that started them while two builds serve
// the workflow: no step of a run is committed by a worker of another
// build, and none diverges (v2's welcome is renamed: a v1 run taken by v2
// would block).
func TestPinnedRunsStayOnTheirBuild(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	v1 := signupVersion(effects, false, WithVersioning(Pinned))
	v2 := NewWorkflow("signup", func(ctx *Context, in string) (string, error) {
		if _, err := Step(ctx, "send-welcome-email", func(sctx context.Context) (string, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return "ok", nil
		}); err != nil {
			return "", err
		}
		if _, err := WaitEvent[string](ctx, "confirmed"); err != nil {
			return "", err
		}
		return "v2", nil
	}, WithEvent[string]("confirmed"), WithVersioning(Pinned))
	cfg := func(b string) WorkerConfig {
		return WorkerConfig{Build: b, Concurrency: 4, AckWait: 2 * time.Second, Topology: env.topo}
	}
	env.worker(cfg("v1"), v1)
	env.worker(cfg("v2"), v2)
	const n = 40
	for i := range n {
		_, err := c.StartByName(ctx, "signup", json.RawMessage(`"x"`), WithRunID(fmt.Sprintf("p-%d", i)))
		require.NoError(t, err)
	}
	builds := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("p-%d", i)
		require.Eventually(t, func() bool {
			waits, err := c.OpenWaits(ctx, id)
			return err == nil && len(waits) == 1
		}, 30*time.Second, 10*time.Millisecond, id)
	}
	// The runs each build holds, as an operator reads them.
	status, err := c.EngineStatus(ctx)
	require.NoError(t, err)
	held := status.Builds["signup"]
	require.Equal(t, n, held["v1"]+held["v2"], "%v", held)
	require.NotZero(t, held["v1"], "%v", held)
	require.NotZero(t, held["v2"], "%v", held)
	for i := range n {
		_, err := c.SendEvent(ctx, fmt.Sprintf("p-%d", i), "confirmed", "c", json.RawMessage(`"yes"`))
		require.NoError(t, err)
	}
	for i := range n {
		id := fmt.Sprintf("p-%d", i)
		run, err := c.WaitRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", id, run.Error)
		builds[run.Build]++
		steps, err := c.Steps(ctx, id)
		require.NoError(t, err)
		for _, s := range steps {
			if s.Kind == "" {
				require.Equal(t, run.Build, s.Build, "%s: step %s committed by another build", id, s.StepID)
			}
		}
	}
	require.Len(t, builds, 2, "both builds took runs: %v", builds)
	for step, k := range effects.snapshot() {
		require.Equal(t, 1, k, step)
	}
}
