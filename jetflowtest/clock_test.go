package jetflowtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/jetflowtest"
)

// threeDaySleeper sleeps three days between two steps.
func threeDaySleeper() *jetflow.Workflow[string, string] {
	return jetflow.NewWorkflow("sleeper", func(ctx *jetflow.Context, user string) (string, error) {
		if _, err := jetflow.Step(ctx, "welcome", func(context.Context) (string, error) { return "hi " + user, nil }); err != nil {
			return "", err
		}
		if err := jetflow.Sleep(ctx, "cool-off", 72*time.Hour); err != nil {
			return "", err
		}
		return jetflow.Step(ctx, "tips", func(context.Context) (string, error) { return "tips for " + user, nil })
	})
}

// timeAckWait is the AckWait of the time tests' Envs; their Timeout, which
// bounds every wait, derives from it.
const timeAckWait = time.Second

var timeCfg = jetflowtest.Config{AckWait: timeAckWait, Timeout: 30 * timeAckWait}

// endedWithin fails the test unless the run ended within the Env's Timeout
// after since.
func endedWithin(t *testing.T, since time.Time) {
	t.Helper()
	if took, limit := time.Since(since), timeCfg.Timeout; took > limit {
		t.Fatalf("run ended %s after the advance; want within the Env's Timeout %s", took, limit)
	}
}

func TestAdvanceWakesAThreeDaySleep(t *testing.T) {
	t.Parallel()
	env := jetflowtest.NewWithConfig(t, timeCfg, threeDaySleeper())
	started := env.Clock().Now()
	h := jetflowtest.Start(env, threeDaySleeper(), "ada", jetflow.WithRunID("sleep-1"))
	tm := env.WaitTimer(h.RunID)
	if tm.StepID != "sleep-1.cool-off.0" || tm.Attempt != 0 {
		t.Fatalf("timer = %+v; want the sleep's", tm)
	}
	if d := tm.Due.Sub(started); d < 72*time.Hour || d > 72*time.Hour+env.Clock().Now().Sub(started) {
		t.Fatalf("sleep due %s after the start; want 72h", d)
	}

	// A smaller move leaves the sleep waiting.
	if n := env.Advance(71 * time.Hour); n != 0 {
		t.Fatalf("Advance(71h) fired %d timers; want 0", n)
	}
	r := env.Inspect(h.RunID)
	if r.Run.Status != jetflow.StatusRunning {
		t.Fatalf("after 71h the run is %s; want running", r.Run.Status)
	}
	if _, ok := r.Step("cool-off"); ok {
		t.Fatalf("after 71h the sleep has ended: %v", r.StepNames())
	}
	if ts := env.Timers(); len(ts) != 1 || ts[0].StepID != tm.StepID || !ts[0].Due.Equal(tm.Due) {
		t.Fatalf("after 71h timers = %+v; want the sleep's still stored", ts)
	}

	// The rest of the three days wakes it.
	advanced := time.Now()
	if n := env.Advance(time.Hour); n != 1 {
		t.Fatalf("Advance(1h) fired %d timers; want 1", n)
	}
	out, err := h.Result(timeCtx(t, env))
	if err != nil || out != "tips for ada" {
		t.Fatalf("Result = %q, %v; want tips for ada", out, err)
	}
	endedWithin(t, advanced)
	t.Logf("72h sleep woke %s after the advance", time.Since(advanced))
	r = env.Inspect(h.RunID)
	s, ok := r.Step("cool-off")
	if !ok {
		t.Fatalf("no sleep step in %v", r.StepNames())
	}
	woke, err := jetflowtest.Output[time.Time](s)
	if err != nil || !woke.Equal(tm.Due) {
		t.Fatalf("sleep output = %s, %v; want its deadline %s", woke, err, tm.Due)
	}
	if len(env.Timers()) != 0 {
		t.Fatalf("timers left after the run: %+v", env.Timers())
	}
	// Records keep real time (the sweeper, retention and the run index
	// read them by real time): nothing is stamped three days ahead.
	tips, _ := r.Step("tips")
	if now := time.Now(); tips.CommittedAt.After(now) || r.Run.UpdatedAt.After(now) {
		t.Fatalf("tips committed at %s, run updated at %s: after the real time %s", tips.CommittedAt, r.Run.UpdatedAt, now)
	}
}

// timeCtx is a context bounded by the Env's Timeout, cancelled with the
// test.
func timeCtx(t *testing.T, env *jetflowtest.Env) context.Context {
	ctx, cancel := env.Background()
	t.Cleanup(cancel)
	return ctx
}

// dayApproval waits a day for an approval; without one it answers "timed
// out".
func dayApproval() *jetflow.Workflow[string, string] {
	return jetflow.NewWorkflow("approval", func(ctx *jetflow.Context, doc string) (string, error) {
		who, err := jetflow.WaitEvent[string](ctx, "approved", jetflow.WithTimeout(24*time.Hour))
		if errors.Is(err, jetflow.ErrEventTimeout) {
			return doc + ": timed out", nil
		}
		if err != nil {
			return "", err
		}
		return doc + ": approved by " + who, nil
	}, jetflow.WithEvent[string]("approved"))
}

func TestAdvancePastAnEventTimeout(t *testing.T) {
	t.Parallel()
	env := jetflowtest.NewWithConfig(t, timeCfg, dayApproval())

	timedOut := jetflowtest.Start(env, dayApproval(), "doc-1", jetflow.WithRunID("approval-1"))
	delivered := jetflowtest.Start(env, dayApproval(), "doc-2", jetflow.WithRunID("approval-2"))
	for _, id := range []string{timedOut.RunID, delivered.RunID} {
		if tm := env.WaitTimer(id); tm.StepID != id+".event=approved.0" {
			t.Fatalf("timer of %s = %+v; want its wait's timeout", id, tm)
		}
	}
	ctx := timeCtx(t, env)
	payload, _ := json.Marshal("grace")
	if _, err := env.Client().SendEvent(ctx, delivered.RunID, "approved", "ev-1", payload); err != nil {
		t.Fatalf("SendEvent: %v", err)
	}

	advanced := time.Now()
	env.Advance(25 * time.Hour)
	out, err := timedOut.Result(ctx)
	if err != nil || out != "doc-1: timed out" {
		t.Fatalf("run without an event = %q, %v; want doc-1: timed out", out, err)
	}
	endedWithin(t, advanced)
	if out, err := delivered.Result(ctx); err != nil || out != "doc-2: approved by grace" {
		t.Fatalf("run with an event = %q, %v; want doc-2: approved by grace", out, err)
	}
	s, ok := env.Inspect(timedOut.RunID).Step("event=approved")
	if !ok || !s.Fatal || !strings.Contains(s.Error, "no event approved within 24h") {
		t.Fatalf("wait step = %+v, %v; want its timeout", s, ok)
	}
}

// rateLimited fails its first charge with RetryAfter an hour.
func rateLimited(calls *int, mu *sync.Mutex) *jetflow.Workflow[int, string] {
	return jetflow.NewWorkflow("flaky", func(ctx *jetflow.Context, amount int) (string, error) {
		return jetflow.Step(ctx, "charge", func(context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			*calls++
			if *calls == 1 {
				return "", jetflow.RetryAfter(errors.New("rate limited"), time.Hour)
			}
			return fmt.Sprintf("charged %d on call %d", amount, *calls), nil
		})
	})
}

func TestAdvanceRunsARetryAfterItsDelay(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	wf := rateLimited(&calls, &mu)
	env := jetflowtest.NewWithConfig(t, timeCfg, wf)
	h := jetflowtest.Start(env, wf, 5, jetflow.WithRunID("flaky-1"))
	tm := env.WaitTimer(h.RunID)
	// The timer holds the charge's second attempt.
	if tm.StepID != "flaky-1.charge.0" || tm.Attempt != 2 {
		t.Fatalf("timer = %+v; want the charge's second attempt", tm)
	}
	if n := env.Advance(59 * time.Minute); n != 0 {
		t.Fatalf("Advance(59m) fired %d timers; want 0", n)
	}
	if r := env.Inspect(h.RunID); r.Run.Status != jetflow.StatusRunning || len(r.Steps) != 0 {
		t.Fatalf("after 59m: %s with steps %v; want running without", r.Run.Status, r.StepNames())
	}

	advanced := time.Now()
	if n := env.Advance(time.Minute); n != 1 {
		t.Fatalf("Advance(1m) fired %d timers; want 1", n)
	}
	out, err := h.Result(timeCtx(t, env))
	if err != nil || out != "charged 5 on call 2" {
		t.Fatalf("Result = %q, %v; want charged 5 on call 2", out, err)
	}
	endedWithin(t, advanced)
	s, _ := env.Inspect(h.RunID).Step("charge")
	if s.Attempt != 2 || len(s.Attempts) != 1 || !strings.Contains(s.Attempts[0].Error, "rate limited") {
		t.Fatalf("charge = attempt %d after %+v; want attempt 2 after the rate limit", s.Attempt, s.Attempts)
	}
}

// fatalTB is a testing.TB whose Fatalf records the message and ends
// the goroutine, as the real one does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

func TestTimeNeverGoesBackwards(t *testing.T) {
	t.Parallel()
	tb := &fatalTB{TB: t}
	env := jetflowtest.NewWithConfig(tb, timeCfg, threeDaySleeper())
	env.Advance(time.Hour)
	for _, back := range []func(){
		func() { env.Advance(-time.Minute) },
		func() { env.AdvanceTo(env.Clock().Now().Add(-time.Minute)) },
	} {
		done := make(chan struct{})
		go func() { defer close(done); back() }()
		<-done
		tb.mu.Lock()
		msg := tb.msg
		tb.msg = ""
		tb.mu.Unlock()
		if !strings.Contains(msg, jetflowtest.ErrBackwards.Error()) {
			t.Fatalf("a move back failed with %q; want %v", msg, jetflowtest.ErrBackwards)
		}
		if off := env.Clock().Offset(); off != time.Hour {
			t.Fatalf("offset after a refused move = %s; want 1h", off)
		}
	}
	to := env.Clock().Now().Add(48 * time.Hour)
	env.AdvanceTo(to)
	if off := env.Clock().Offset(); off <= 48*time.Hour || env.Clock().Now().Before(to) {
		t.Fatalf("offset after AdvanceTo(+48h) = %s; want beyond 48h", off)
	}
}

// napper calls work in a step, then sleeps for d.
func napper(d time.Duration, work func()) *jetflow.Workflow[string, string] {
	return jetflow.NewWorkflow("napper", func(ctx *jetflow.Context, user string) (string, error) {
		if _, err := jetflow.Step(ctx, "work", func(context.Context) (string, error) { work(); return "done", nil }); err != nil {
			return "", err
		}
		if err := jetflow.Sleep(ctx, "nap", d); err != nil {
			return "", err
		}
		return "rested " + user, nil
	})
}

func TestRealTimeStillRunsAfterAnAdvance(t *testing.T) {
	t.Parallel()
	wf := napper(timeAckWait, func() {})
	env := jetflowtest.NewWithConfig(t, timeCfg, wf)
	env.Advance(24 * time.Hour)
	// A short sleep started after the move is due by the moved clock and
	// fires by real time, never early.
	started := time.Now()
	out, err := jetflowtest.Run(env, wf, "ada", jetflow.WithRunID("napper-1"))
	if err != nil || out != "rested ada" {
		t.Fatalf("Run = %q, %v; want rested ada", out, err)
	}
	if took := time.Since(started); took < timeAckWait {
		t.Fatalf("a %s sleep ended after %s", timeAckWait, took)
	}
	endedWithin(t, started)
}

func TestAdvanceWhileAStepRuns(t *testing.T) {
	t.Parallel()
	running, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	wf := napper(time.Hour, func() {
		once.Do(func() { close(running) })
		<-gate
	})
	env := jetflowtest.NewWithConfig(t, timeCfg, wf)
	h := jetflowtest.Start(env, wf, "ada", jetflow.WithRunID("napper-1"))
	<-running
	env.Advance(24 * time.Hour)
	moved := env.Clock().Now()
	close(gate)
	tm := env.WaitTimer(h.RunID)
	if tm.StepID != "napper-1.nap.0" || tm.Due.Before(moved.Add(time.Hour)) {
		t.Fatalf("timer = %+v; want the nap due an hour after the move (%s)", tm, moved)
	}
	advanced := time.Now()
	if n := env.Advance(time.Hour); n != 1 {
		t.Fatalf("Advance(1h) fired %d timers; want 1", n)
	}
	if out, err := h.Result(timeCtx(t, env)); err != nil || out != "rested ada" {
		t.Fatalf("Result = %q, %v; want rested ada", out, err)
	}
	endedWithin(t, advanced)
}
