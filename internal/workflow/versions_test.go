package workflow

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// The cases a review of blocked, pinned and changed runs found, each a run
// of two codes (or two builds) under one rig, routed delivery by delivery.

// napFor is a sleep of an hour named "nap", awaited.
func napFor(c *Context) error {
	p, err := c.StartWait("nap", WaitSpec{Kind: state.StepSleep, For: time.Hour})
	if err != nil {
		return err
	}
	_, err = c.Result(p)
	return err
}

// An accepted divergence waives the history's record of the step, not
// the step: the code's step runs once more, and its new record counts on
// every later replay.
func TestWaivedStepRunsOnceMore(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var ran atomic.Int64
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		if _, err := seqStep(c, "s", func(context.Context) (json.RawMessage, error) {
			ran.Add(1)
			return json.RawMessage(`"s"`), nil
		}); err != nil {
			return nil, err
		}
		if err := napFor(c); err != nil {
			return nil, err
		}
		return seqStep(c, "t", ok(`"t"`))
	}
	e := r.executor("w1", body, nil)
	r.serve(e, 2, false)
	r.serveTimers()
	r.start("r", `{}`)
	r.eventually(func() bool { l, _ := r.lease("r"); return l != nil && l.State == state.LeaseParked }, "parked")
	require.EqualValues(t, 1, ran.Load())
	_, parkedAt := r.lease("r")
	run, rev := r.runRecord("r")
	_, _, err := r.store.Block(r.ctx(), run, rev, jetflowtype.RunBlock{Reason: jetflowtype.BlockDivergence, Since: time.Now(),
		Divergence: &jetflowtype.Divergence{Kind: jetflowtype.DivergenceKindChanged,
			History: &jetflowtype.DivergedStep{StepID: "r.s.0", Name: "s", Kind: "sleep"},
			Code:    &jetflowtype.DivergedStep{StepID: "r.s.0", Name: "s", Kind: "step"}}})
	require.NoError(t, err)
	_, waived, err := Unblock(r.ctx(), r.a, r.store, "r", true)
	require.NoError(t, err)
	require.Equal(t, "r.s.0", waived)
	r.eventually(func() bool {
		l, lrev := r.lease("r")
		return ran.Load() == 2 && l != nil && l.State == state.LeaseParked && lrev > parkedAt
	}, "s ran again once, and the run parked again")
	require.Equal(t, 1, r.fireDue(time.Hour))
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status)
	require.EqualValues(t, 2, ran.Load(), "the waived step ran on a later replay too")
}

// A task of a pinned run handed to a worker of another build is handed
// back as a delivery that started nothing: the step it reaches on its
// build counts attempt 1 (a step of one attempt runs).
func TestPinnedHandBackCountsNoAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var ran atomic.Int64
	body := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		if _, err := seqStep(c, "s1", ok(`"s1"`)); err != nil {
			return nil, err
		}
		if err := napFor(c); err != nil {
			return nil, err
		}
		return c.StepWithKey("s2", RetryPolicy{MaxAttempts: 1}, TaskKey{}, func(context.Context) (json.RawMessage, error) {
			ran.Add(1)
			return json.RawMessage(`"s2"`), nil
		})
	}
	pin := func(build string) func(*Config) {
		return func(cfg *Config) {
			cfg.Build = build
			cfg.Definitions = map[string]Definition{wf: {Name: wf, Run: body, Pinned: true}}
		}
	}
	exA, exB := r.executor("wa", body, pin("A")), r.executor("wb", body, pin("B"))
	var toB atomic.Bool
	r.serveHandlers(2, false, probe(func(ctx context.Context, d *consume.Delivery) {
		task, _ := state.DecodeTask(d.Msg.Data())
		if _, n := meta(t, d); task.Wake && n == 1 && toB.CompareAndSwap(false, true) {
			exB.Runs().Handle(ctx, d) // the nap's wake reaches build B first
			return
		}
		exA.Runs().Handle(ctx, d)
	}), exA.Branches())
	r.serveTimers()
	r.start("r", `{}`)
	r.eventually(func() bool { l, _ := r.lease("r"); return l != nil && l.State == state.LeaseParked }, "parked")
	run, _ := r.runRecord("r")
	require.Equal(t, "A", run.Build)
	r.fireDue(time.Hour)
	end := r.wait("r")
	require.True(t, toB.Load())
	require.Equal(t, state.StatusCompleted, end.Status, "%+v", end.Error)
	require.EqualValues(t, 1, ran.Load())
}

// A pinned run taken up again before its first park (its worker drained at
// a step boundary) goes back to the build that ran its first step: a worker
// of another build, whose code renames the next step, hands it over.
func TestPinnedRunGoesBackBeforeItsFirstPark(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	var draining atomic.Bool
	body := func(second string) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
			if _, err := seqStep(c, "s1", func(context.Context) (json.RawMessage, error) {
				draining.Store(true) // A's worker drains during s1
				return json.RawMessage(`"s1"`), nil
			}); err != nil {
				return nil, err
			}
			return seqStep(c, second, ok(`"s2"`))
		}
	}
	pin := func(build string, run func(c *Context, _ json.RawMessage) (json.RawMessage, error)) func(*Config) {
		return func(cfg *Config) {
			cfg.Build = build
			cfg.Definitions = map[string]Definition{wf: {Name: wf, Run: run, Pinned: true}}
			if build == "A" {
				cfg.Stopping = draining.Load
			}
		}
	}
	bodyA, bodyB := body("s2"), body("s2-renamed")
	exA, exB := r.executor("wa", bodyA, pin("A", bodyA)), r.executor("wb", bodyB, pin("B", bodyB))
	var sawB atomic.Bool
	r.serveHandlers(2, false, probe(func(ctx context.Context, d *consume.Delivery) {
		if _, n := meta(t, d); n == 2 {
			sawB.Store(true)
			exB.Runs().Handle(ctx, d) // the redelivery after A's hand-over
			return
		}
		draining.Store(false) // A is back (or never left)
		exA.Runs().Handle(ctx, d)
	}), nil)
	r.start("r", `{}`)
	end := r.wait("r")
	require.True(t, sawB.Load(), "build B never got the run")
	require.Equal(t, state.StatusCompleted, end.Status, "%+v", end.Error)
	require.Equal(t, "A", end.Build)
	require.NotNil(t, r.step("r.s2.0"), "A's second step")
	require.Nil(t, r.step("r.s2-renamed.0"), "B ran its step in a run pinned to A")
}

// An event wait renamed under a run whose event came: the wake's replay
// under the new code is blocked, not parked on a wait no event will end.
func TestRenamedEventWaitBlocks(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	body := func(event string) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
			p, err := c.StartWait("", WaitSpec{Kind: state.StepEvent, Event: event})
			if err != nil {
				return nil, err
			}
			if _, err := c.Result(p); err != nil {
				return nil, err
			}
			return seqStep(c, "ship", ok(`"shipped"`))
		}
	}
	ex1, ex2 := r.executor("w1", body("paid"), nil), r.executor("w2", body("payment"), nil)
	r.serveHandlers(2, false, probe(func(ctx context.Context, d *consume.Delivery) {
		if task, _ := state.DecodeTask(d.Msg.Data()); task.Wake {
			ex2.Runs().Handle(ctx, d)
			return
		}
		ex1.Runs().Handle(ctx, d)
	}), nil)
	r.start("r", `{}`)
	r.eventually(func() bool { l, _ := r.lease("r"); return l != nil && l.State == state.LeaseParked }, "parked at paid")
	s := Sender{Assets: r.a, Runs: r.store, Now: time.Now}
	ev := Event{RunID: "r", Name: "paid", ID: "e1", Payload: json.RawMessage(`{}`)}
	target, err := s.Resolve(r.ctx(), ev)
	require.NoError(t, err)
	_, err = s.Deliver(r.ctx(), target, ev)
	require.NoError(t, err)
	r.eventually(func() bool { run, _ := r.runRecord("r"); return run.Status == state.StatusBlocked }, "blocked")
	run, _ := r.runRecord("r")
	require.Equal(t, jetflowtype.DivergenceRenamed, run.Block.Divergence.Kind)
	require.Nil(t, r.step("r.ship.0"))
}

// A step started with Go, running as a branch and not awaited where the
// run parked, is not run in place by new code that calls it as a
// sequential step: the run is blocked, the step ran once.
func TestBranchInFlightIsNotRunInPlace(t *testing.T) {
	t.Parallel()
	r := newRig(t, 2*time.Second)
	var ran atomic.Int64
	release := make(chan struct{})
	charge := func(ctx context.Context) (json.RawMessage, error) {
		ran.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`"charged"`), nil
	}
	v1 := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		a, err := c.Start("charge", RetryPolicy{}, TaskKey{}, charge)
		if err != nil {
			return nil, err
		}
		if err := napFor(c); err != nil {
			return nil, err
		}
		return c.Result(a)
	}
	v2 := func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		out, err := seqStep(c, "charge", charge)
		if err != nil {
			return nil, err
		}
		return out, napFor(c)
	}
	ex1, ex2 := r.executor("w1", v1, nil), r.executor("w2", v2, nil)
	r.serveHandlers(4, false, probe(func(ctx context.Context, d *consume.Delivery) {
		if task, _ := state.DecodeTask(d.Msg.Data()); task.Wake {
			ex2.Runs().Handle(ctx, d)
			return
		}
		ex1.Runs().Handle(ctx, d)
	}), ex1.Branches())
	r.serveTimers()
	defer close(release)
	r.start("r", `{}`)
	r.eventually(func() bool { l, _ := r.lease("r"); return l != nil && l.State == state.LeaseParked && ran.Load() == 1 }, "parked, the branch running")
	r.fireDue(time.Hour)
	r.eventually(func() bool { run, _ := r.runRecord("r"); return run.Status == state.StatusBlocked }, "blocked")
	run, _ := r.runRecord("r")
	require.Equal(t, jetflowtype.DivergenceKindChanged, run.Block.Divergence.Kind)
	require.EqualValues(t, 1, ran.Load(), "charge ran beside its own branch")
}

// A branch task whose code diverges blocks the run and stays stored,
// handed back as unstarted: once code that replays the run takes it on,
// the branch runs (a branch published anew under its step ID would be
// dropped within the broker's duplicate window).
func TestBlockedBranchTaskStaysStored(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	body := func(first string) func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
		return func(c *Context, _ json.RawMessage) (json.RawMessage, error) {
			if _, err := seqStep(c, first, ok(`"s0"`)); err != nil {
				return nil, err
			}
			b, err := c.Start("b", RetryPolicy{}, TaskKey{}, ok(`"b"`))
			if err != nil {
				return nil, err
			}
			x, err := c.Start("x", RetryPolicy{}, TaskKey{}, ok(`"x"`))
			if err != nil {
				return nil, err
			}
			if _, err := c.Await([]*Pending{b, x}, false); err != nil {
				return nil, err
			}
			return json.RawMessage(`"done"`), nil
		}
	}
	cfg := func(c *Config) { c.BlockRecheck = time.Second }
	ex1, ex2 := r.executor("w1", body("s0"), cfg), r.executor("w2", body("s0-renamed"), cfg)
	r.serveHandlers(2, false, ex1.Runs(), probe(func(ctx context.Context, d *consume.Delivery) {
		task, _ := state.DecodeTask(d.Msg.Data())
		if _, n := meta(t, d); task.StepID == "r.b.0" && n == 1 {
			ex2.Branches().Handle(ctx, d) // b's first delivery: new code
			return
		}
		ex1.Branches().Handle(ctx, d)
	}))
	r.serveTimers()
	r.start("r", `{}`)
	r.eventually(func() bool { run, _ := r.runRecord("r"); return run.Status == state.StatusBlocked }, "blocked by the branch")
	_, _, pending := r.pending(jetstream.BranchSubject(wf, "r.b.0"))
	require.True(t, pending, "the blocked branch's task was dropped")
	r.fireDue(2 * time.Second) // the recheck: the old code replays it and goes on
	end := r.wait("r")
	require.Equal(t, state.StatusCompleted, end.Status, "%+v", end.Error)
	require.NotNil(t, r.step("r.b.0"))
}
