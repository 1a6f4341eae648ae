package jetflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The rows of docs/changing-workflows.md, as v1 and v2 of one workflow
// under runs that v1 started and left parked: at an event wait, at a
// sleep, or between two sequential steps (its worker drained at a step
// boundary). Each row's workflow runs its changed steps (ops), then the
// park, then a step "tail". Every step function counts its side effect
// under its step ID, as an outside system keyed by Idempotency-Key would.

// op is one call of a row's body.
type op struct {
	kind string // "step", "sleep", "child", "go" (Go each of names, then AwaitAll)
	name string
	// names are a "go"'s branches; child a "child"'s child run ID.
	names []string
	child string
	sleep time.Duration
}

func stepOp(name string) op                       { return op{kind: "step", name: name} }
func sleepOp(name string) op                      { return op{kind: "sleep", name: name, sleep: time.Millisecond} }
func childOp(name, runID string) op               { return op{kind: "child", name: name, child: runID} }
func goOp(names ...string) op                     { return op{kind: "go", names: names} }
func longSleepOp(name string, d time.Duration) op { return op{kind: "sleep", name: name, sleep: d} }

// park is where a row's run waits while its worker is replaced.
type park string

const (
	parkEvent  park = "event"
	parkSleep  park = "sleep"
	parkInline park = "inline"
)

// changeRig is one test's deployment: the rows' workflows in two versions,
// their side effects, and the gate that holds v1's runs in their "gate"
// step (parkInline).
type changeRig struct {
	t       *testing.T
	env     *testEnv
	c       *Client
	effects *counter
	where   park
	nap     time.Duration
	kid     *Workflow[string, string]

	mu    sync.Mutex
	gated int
	gate  chan struct{}
}

func newChangeRig(t *testing.T, where park) *changeRig {
	env := newEnv(t, Topology{})
	r := &changeRig{t: t, env: env, effects: newCounter(), where: where, nap: 3 * time.Second, gate: make(chan struct{})}
	r.kid = NewWorkflow("kid", func(ctx *Context, in string) (string, error) { return "kid " + in, nil })
	r.c = env.client()
	return r
}

// effect is a step function that counts its side effect.
func (r *changeRig) effect(ctx context.Context) (string, error) {
	info, _ := StepDetailsFrom(ctx)
	r.effects.inc(info.StepID)
	return info.StepID, nil
}

// body runs ops, the rig's park and the tail. gated: the "gate" step of
// parkInline waits for the rig's gate (v1, whose worker drains there).
func (r *changeRig) body(ctx *Context, ops []op, gated bool) (string, error) {
	for _, o := range ops {
		var err error
		switch o.kind {
		case "step":
			_, err = Step(ctx, o.name, r.effect)
		case "sleep":
			err = Sleep(ctx, o.name, o.sleep)
		case "child":
			_, err = Child(ctx, r.kid, o.name, WithChildRunID(o.child)).Get(ctx)
		case "go":
			fs := make([]Awaitable, len(o.names))
			for i, n := range o.names {
				fs[i] = Go(ctx, n, r.effect)
			}
			err = AwaitAll(ctx, fs...)
		}
		if err != nil {
			return "", err
		}
	}
	switch r.where {
	case parkEvent:
		if _, err := WaitEvent[string](ctx, "go"); err != nil {
			return "", err
		}
	case parkSleep:
		if err := Sleep(ctx, "nap", r.nap); err != nil {
			return "", err
		}
	case parkInline:
		if _, err := Step(ctx, "gate", func(sctx context.Context) (string, error) {
			if gated {
				r.mu.Lock()
				r.gated++
				r.mu.Unlock()
				<-r.gate
			}
			return r.effect(sctx)
		}); err != nil {
			return "", err
		}
	}
	return Step(ctx, "tail", r.effect)
}

// change is one row: the code before and after, and what a run of v1
// parked after the changed steps gets under v2.
type change struct {
	name   string
	v1, v2 []op
	// input: v2 takes another input type, which v1's input does not
	// decode into.
	input bool
	// want is the kind of divergence ("": the change is safe and the run
	// completes under v2).
	want DivergenceKind
}

var changes = []change{
	{name: "renamed", v1: []op{stepOp("a"), stepOp("charge")}, v2: []op{stepOp("a"), stepOp("charge_card")}, want: DivergenceKind("renamed")},
	{name: "removed", v1: []op{stepOp("a"), stepOp("charge")}, v2: []op{stepOp("charge")}, want: DivergenceKind("removed")},
	{name: "swapped", v1: []op{stepOp("a"), stepOp("b")}, v2: []op{stepOp("b"), stepOp("a")}, want: DivergenceKind("reordered")},
	{name: "inserted", v1: []op{stepOp("a"), stepOp("b")}, v2: []op{stepOp("x"), stepOp("a"), stepOp("b")}, want: DivergenceKind("inserted")},
	{name: "kind", v1: []op{stepOp("a"), sleepOp("pause")}, v2: []op{stepOp("a"), stepOp("pause")}, want: DivergenceKind("kind-changed")},
	{name: "child", v1: []op{stepOp("a"), childOp("k", "kid-one")}, v2: []op{stepOp("a"), childOp("k", "kid-two")}, want: DivergenceKind("child-changed")},
	{name: "input", v1: []op{stepOp("a")}, v2: []op{stepOp("a")}, input: true, want: DivergenceKind("input-changed")},
	{name: "added", v1: []op{stepOp("a")}, v2: []op{stepOp("a")}}, // v2 adds "extra" after the tail
	{name: "together", v1: []op{goOp("p", "q")}, v2: []op{goOp("q", "p")}},
	{name: "duration", v1: []op{stepOp("a"), longSleepOp("pause", 10*time.Millisecond)}, v2: []op{stepOp("a"), longSleepOp("pause", time.Hour)}},
}

// workflows are the rows' workflows in version v (1 or 2).
func (r *changeRig) workflows(v int) []Registrable {
	wfs := []Registrable{r.kid}
	for _, ch := range changes {
		ops := ch.v1
		if v == 2 {
			ops = ch.v2
		}
		name := "chg-" + ch.name
		switch {
		case v == 2 && ch.input:
			wfs = append(wfs, NewWorkflow(name, func(ctx *Context, in struct{ N int }) (string, error) {
				return r.body(ctx, ops, false)
			}, WithEvent[string]("go")))
		case v == 2 && ch.name == "added":
			wfs = append(wfs, NewWorkflow(name, func(ctx *Context, in string) (string, error) {
				if _, err := r.body(ctx, ops, false); err != nil {
					return "", err
				}
				return Step(ctx, "extra", r.effect)
			}, WithEvent[string]("go")))
		default:
			wfs = append(wfs, NewWorkflow(name, func(ctx *Context, in string) (string, error) {
				return r.body(ctx, ops, v == 1)
			}, WithEvent[string]("go")))
		}
	}
	return wfs
}

func (r *changeRig) worker(v int) *Worker {
	cfg := WorkerConfig{Build: fmt.Sprintf("v%d", v), Concurrency: 32, AckWait: 2 * time.Second,
		SweepInterval: 200 * time.Millisecond, StuckAfter: 6 * time.Second, blockRecheck: 500 * time.Millisecond}
	cfg.Topology = r.env.topo
	return startWorker(r.t, r.env.conn(), cfg, r.workflows(v)...)
}

func runIDOf(ch change) string { return "run-" + ch.name }

// parked waits until every row's run waits where the rig parks it.
func (r *changeRig) parked(ctx context.Context) {
	r.t.Helper()
	require.Eventually(r.t, func() bool {
		if r.where == parkInline {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.gated == len(changes)
		}
		for _, ch := range changes {
			waits, err := r.c.OpenWaits(ctx, runIDOf(ch))
			if err != nil || len(waits) == 0 || waits[len(waits)-1].Kind != string(r.where) ||
				r.where == parkSleep && waits[len(waits)-1].Name != "nap" {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the runs did not park at the %s", r.where)
}

func testChangesUnder(t *testing.T, where park) {
	r := newChangeRig(t, where)
	ctx := ctxT(t, 3*time.Minute)
	v1 := r.worker(1)
	for _, ch := range changes {
		_, err := r.c.StartByName(ctx, "chg-"+ch.name, json.RawMessage(`"in"`), WithRunID(runIDOf(ch)))
		require.NoError(t, err, ch.name)
	}
	r.parked(ctx)
	before := r.effects.snapshot()

	// v1 leaves, v2 comes. Under parkInline v2 is up first and v1
	// drains at the step boundary after "gate", handing every run over.
	var v2 *Worker
	if where == parkInline {
		v2 = r.worker(2)
		stopped := make(chan error, 1)
		go func() { stopped <- v1.Stop(ctxT(t, time.Minute)) }()
		require.Eventually(t, func() bool { return v1.draining.Load() }, 10*time.Second, time.Millisecond)
		close(r.gate)
		require.NoError(t, <-stopped)
	} else {
		require.NoError(t, v1.Stop(ctxT(t, 30*time.Second)))
		v2 = r.worker(2)
		if where == parkEvent {
			for _, ch := range changes {
				_, err := r.c.SendEvent(ctx, runIDOf(ch), "go", "go-1", json.RawMessage(`"go"`))
				require.NoError(t, err, ch.name)
			}
		}
	}

	// Under v2 the unsafe rows block before their diverging step runs, the
	// safe rows complete.
	for _, ch := range changes {
		id := runIDOf(ch)
		if ch.want == "" {
			run, err := r.c.WaitRun(ctx, id)
			require.NoError(t, err, ch.name)
			require.Equal(t, StatusCompleted, run.Status, "%s: %+v", ch.name, run.Error)
			continue
		}
		run := r.waitStatus(ctx, id, StatusBlocked)
		require.NotNil(t, run.Block, ch.name)
		require.Equal(t, ch.want, run.Block.Divergence.Kind, "%s: %s", ch.name, run.Block.Divergence)
		require.Equal(t, "v2", run.Block.Build, ch.name)
	}
	for _, ch := range changes {
		id := runIDOf(ch)
		for step, n := range r.effects.snapshot() {
			require.LessOrEqual(t, n, 1, "%s: step %s ran %d times", ch.name, step, n)
		}
		if ch.want != "" {
			for step, n := range r.effects.snapshot() {
				if strings.HasPrefix(step, id+".") && !strings.HasSuffix(step, ".gate.0") {
					require.Equal(t, before[step], n, "%s: v2 ran step %s of a blocked run", ch.name, step)
				}
			}
		}
	}
	require.Equal(t, 1, r.effects.get("run-added.extra.0"), "a step added after the last runs")

	// A rollback: v1 comes back and takes the blocked runs on.
	require.NoError(t, v2.Stop(ctxT(t, 30*time.Second)))
	v1 = r.worker(1)
	stopAtEnd(t, v1, 30*time.Second)
	for _, ch := range changes {
		if ch.want == "" {
			continue
		}
		run, err := r.c.WaitRun(ctx, runIDOf(ch))
		require.NoError(t, err, ch.name)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", ch.name, run.Error)
		require.Nil(t, run.Block, ch.name)
	}
	for step, n := range r.effects.snapshot() {
		require.Equal(t, 1, n, "step %s ran %d times", step, n)
	}
}

// waitStatus waits until run id has status st and returns it.
func (r *changeRig) waitStatus(ctx context.Context, id string, st RunStatus) Run {
	r.t.Helper()
	var run Run
	require.Eventually(r.t, func() bool {
		var err error
		run, err = r.c.GetRun(ctx, id)
		return err == nil && (run.Status == st || run.Status.Terminal())
	}, 60*time.Second, 20*time.Millisecond, "run %s never became %s", id, st)
	require.Equal(r.t, st, run.Status, "run %s: %+v", id, run.Error)
	return run
}

func TestChangeUnderRunsParkedAtAnEvent(t *testing.T) {
	t.Parallel()
	testChangesUnder(t, parkEvent)
}

func TestChangeUnderRunsParkedAtASleep(t *testing.T) {
	t.Parallel()
	testChangesUnder(t, parkSleep)
}

func TestChangeUnderRunsBetweenSequentialSteps(t *testing.T) {
	t.Parallel()
	testChangesUnder(t, parkInline)
}

// A run waits, at one await, for two branches (one of them's retry is due
// later) and an event. v2 awaits that branch at once (Go, then Get): it
// would run the step in place, beside the branch's own retry. The event wakes the run
// under v2: it is blocked (the step is not run in place); v1 takes it back
// and the branch's retry commits it.
func TestChangeAwaitMovedAcrossABranch(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	charge := func(sctx context.Context) (string, error) {
		info, _ := StepDetailsFrom(sctx)
		if effects.inc(info.StepID) == 1 {
			return "", fmt.Errorf("card network timeout")
		}
		return "charged", nil
	}
	noop := func(context.Context) (string, error) { return "noted", nil }
	retry := WithRetry(RetryPolicy{MaxAttempts: 3, InitialInterval: 4 * time.Second, MaxInterval: 4 * time.Second})
	v1 := NewWorkflow("moved", func(ctx *Context, in string) (string, error) {
		f := Go(ctx, "charge", charge, retry)
		n := Go(ctx, "note", noop)
		w := OnEvent[string](ctx, "go")
		if err := AwaitAll(ctx, f, n, w); err != nil {
			return "", err
		}
		return f.Get(ctx)
	}, WithEvent[string]("go"))
	v2 := NewWorkflow("moved", func(ctx *Context, in string) (string, error) {
		if _, err := Go(ctx, "charge", charge, retry).Get(ctx); err != nil {
			return "", err
		}
		n := Go(ctx, "note", noop)
		w := OnEvent[string](ctx, "go")
		if err := AwaitAll(ctx, n, w); err != nil {
			return "", err
		}
		return "charged", nil
	}, WithEvent[string]("go"))
	cfg := func(b string) WorkerConfig {
		return WorkerConfig{Build: b, AckWait: 2 * time.Second, SweepInterval: 200 * time.Millisecond,
			StuckAfter: 6 * time.Second, blockRecheck: 500 * time.Millisecond, Topology: env.topo}
	}
	w1 := startWorker(t, env.conn(), cfg("v1"), v1)
	_, err := c.StartByName(ctx, "moved", json.RawMessage(`"in"`), WithRunID("m-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("m-1.charge.0") == 1 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, w1.Stop(ctxT(t, 30*time.Second)))
	w2 := startWorker(t, env.conn(), cfg("v2"), v2)
	_, err = c.SendEvent(ctx, "m-1", "go", "go-1", json.RawMessage(`"go"`))
	require.NoError(t, err)
	r := &changeRig{t: t, c: c}
	run := r.waitStatus(ctx, "m-1", StatusBlocked)
	require.Equal(t, DivergenceKind("kind-changed"), run.Block.Divergence.Kind, "%s", run.Block.Divergence)
	require.Equal(t, 1, effects.get("m-1.charge.0"), "v2 ran the branch's step in place")

	require.NoError(t, w2.Stop(ctxT(t, 30*time.Second)))
	stopAtEnd(t, startWorker(t, env.conn(), cfg("v1"), v1), 30*time.Second)
	run, err = c.WaitRun(ctx, "m-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, 2, effects.get("m-1.charge.0"), "the failed attempt and its retry")
}

// An operator moves a blocked run on: a plain unblock replays it with the
// workers' code, which blocks it again; accepting the divergence waives
// the history's step, and the renamed step runs (its side effect happens a
// second time, under its new step ID, as the operator accepted).
func TestUnblockRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	effect := func(sctx context.Context) (string, error) {
		info, _ := StepDetailsFrom(sctx)
		effects.inc(info.StepID)
		return "ok", nil
	}
	version := func(welcome string) *Workflow[string, string] {
		return NewWorkflow("signup", func(ctx *Context, in string) (string, error) {
			if _, err := Step(ctx, welcome, effect); err != nil {
				return "", err
			}
			if _, err := WaitEvent[string](ctx, "confirmed"); err != nil {
				return "", err
			}
			return Step(ctx, "activate", effect)
		}, WithEvent[string]("confirmed"))
	}
	cfg := func(b string) WorkerConfig {
		return WorkerConfig{Build: b, AckWait: 2 * time.Second, SweepInterval: time.Minute, blockRecheck: time.Hour, Topology: env.topo}
	}
	w1 := startWorker(t, env.conn(), cfg("v1"), version("send-welcome"))
	_, err := c.StartByName(ctx, "signup", json.RawMessage(`"ann"`), WithRunID("s-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return effects.get("s-1.send-welcome.0") == 1 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, w1.Stop(ctxT(t, 30*time.Second)))
	stopAtEnd(t, startWorker(t, env.conn(), cfg("v2"), version("send-welcome-email")), 30*time.Second)

	_, err = c.UnblockRun(ctx, "s-1", UnblockOptions{})
	require.ErrorIs(t, err, ErrRunNotBlocked, "a running run")
	_, err = c.SendEvent(ctx, "s-1", "confirmed", "c-1", json.RawMessage(`"yes"`))
	require.NoError(t, err)
	r := &changeRig{t: t, c: c}
	run := r.waitStatus(ctx, "s-1", StatusBlocked)
	require.Equal(t, DivergenceKind("renamed"), run.Block.Divergence.Kind)
	require.Equal(t, 0, run.Block.Divergence.Position)
	require.Equal(t, "s-1.send-welcome.0", run.Block.Divergence.History.StepID)
	require.Equal(t, "s-1.send-welcome-email.0", run.Block.Divergence.Code.StepID)
	since := run.Block.Since

	// A plain unblock: the v2 code replays it and blocks it again.
	out, err := c.UnblockRun(ctx, "s-1", UnblockOptions{})
	require.NoError(t, err)
	require.Equal(t, StatusRunning, out.Status)
	require.Empty(t, out.Waived)
	require.Eventually(t, func() bool {
		run, err = c.GetRun(ctx, "s-1")
		return err == nil && run.Status == StatusBlocked && run.Block.Since.After(since)
	}, 30*time.Second, 10*time.Millisecond, "the unblocked run was not replayed")
	require.Zero(t, effects.get("s-1.send-welcome-email.0"))

	// Accepted: the renamed step runs.
	out, err = c.UnblockRun(ctx, "s-1", UnblockOptions{AcceptDivergence: true})
	require.NoError(t, err)
	require.Equal(t, "s-1.send-welcome.0", out.Waived)
	run, err = c.WaitRun(ctx, "s-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status, "%+v", run.Error)
	require.Equal(t, []string{"s-1.send-welcome.0"}, run.Waived)
	require.Equal(t, map[string]int{"s-1.send-welcome.0": 1, "s-1.send-welcome-email.0": 1, "s-1.activate.0": 1}, effects.snapshot())
	_, err = c.UnblockRun(ctx, "s-1", UnblockOptions{})
	require.ErrorIs(t, err, ErrRunNotBlocked)
	_, err = c.UnblockRun(ctx, "nope", UnblockOptions{})
	require.ErrorIs(t, err, ErrRunNotFound)
}

// Before a build takes work: its code is replayed against the runs in
// flight, running nothing, and the runs it would block are reported; a
// worker that checks before serving does not start while there are some,
// and starts once they have ended.
func TestCheckCodeBeforeServing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	c := env.client()
	ctx := ctxT(t, 2*time.Minute)
	v1 := signupVersion(effects, false)
	w1 := startWorker(t, env.conn(), WorkerConfig{Build: "v1", Topology: env.topo}, v1)
	for _, id := range []string{"s-1", "s-2"} {
		_, err := c.StartByName(ctx, "signup", json.RawMessage(`"x"`), WithRunID(id))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return effects.get(id+".send-welcome.0") == 1 }, 30*time.Second, 10*time.Millisecond)
	}
	r := &changeRig{t: t, c: c}
	require.Eventually(t, func() bool { w, err := c.OpenWaits(ctx, "s-2"); return err == nil && len(w) == 1 }, 30*time.Second, 10*time.Millisecond)

	renamed := NewWorkflow("signup", func(ctx *Context, in string) (string, error) {
		if _, err := Step(ctx, "send-welcome-email", func(context.Context) (string, error) { return "", nil }); err != nil {
			return "", err
		}
		return WaitEvent[string](ctx, "confirmed")
	}, WithEvent[string]("confirmed"))
	check, err := c.CheckCode(ctx, mustRegistry(t, renamed), "v2")
	require.NoError(t, err)
	require.Equal(t, 2, check.Checked)
	require.Len(t, check.Blocked, 2)
	for _, b := range check.Blocked {
		require.Equal(t, DivergenceKind("renamed"), b.Divergence.Kind, b.RunID)
		require.Equal(t, 0, b.Divergence.Position)
	}
	same, err := c.CheckCode(ctx, mustRegistry(t, signupVersion(newCounter(), true)), "v2")
	require.NoError(t, err)
	require.True(t, same.Clean(), "the patched code replays both: %+v", same.Blocked)
	require.Zero(t, effects.get("s-1.send-welcome-email.0"), "the check runs no step")

	w2, err := NewWorker(env.conn(), mustRegistry(t, renamed), WorkerConfig{Build: "v2", CheckBeforeServing: true, Topology: env.topo})
	require.NoError(t, err)
	err = w2.Start(ctx)
	var ce *CodeCheckError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, ErrWouldBlock)
	require.Len(t, ce.Check.Blocked, 2)

	// Once the runs in flight have ended, the worker starts.
	for _, id := range []string{"s-1", "s-2"} {
		_, err := c.SendEvent(ctx, id, "confirmed", "c", json.RawMessage(`"yes"`))
		require.NoError(t, err)
		run := r.waitStatus(ctx, id, StatusCompleted)
		require.Equal(t, StatusCompleted, run.Status)
	}
	require.NoError(t, w1.Stop(ctxT(t, 30*time.Second)))
	require.NoError(t, w2.Start(ctx))
	stopAtEnd(t, w2, 30*time.Second)
}
