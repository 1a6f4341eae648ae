package jetflowtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/jetflowtest"
)

var update = flag.Bool("update", false, "rewrite jetflowtest/testdata's golden histories from a fresh run")

// goldenPath is the golden history of the order workflow (goldenPlan).
var goldenPath = filepath.Join("testdata", "order-history.json")

// op is one thing the test order workflow does: a step, a group of steps
// in flight together (Go, then AwaitAll), a child run, a sleep, an event
// wait, a panic or a loop of steps that never ends.
type op struct {
	kind  string   // step, group, child, sleep, event, panic, loop, block
	names []string // a child's: its run ID, when set
	d     time.Duration
}

func step(name string) op                   { return op{kind: "step", names: []string{name}} }
func group(names ...string) op              { return op{kind: "group", names: names} }
func sleep(name string, d time.Duration) op { return op{kind: "sleep", names: []string{name}, d: d} }
func event(name string) op                  { return op{kind: "event", names: []string{name}} }

// goldenPlan is what the order workflow did when its golden history was
// recorded: every kind of step the replay check compares.
var goldenPlan = []op{
	step("reserve"), step("charge"), group("pack", "label"), {kind: "child"},
	sleep("cool", time.Second), event("paid"), step("ship"),
}

// receipt is the order's child workflow.
var receipt = jetflow.NewWorkflow("receipt", func(ctx *jetflow.Context, amount int) (string, error) {
	return jetflow.Step(ctx, "render", func(context.Context) (string, error) { return "receipt", nil })
})

// orderPlan is the workflow "order" doing plan: the code as changed by a
// variant. A step returns its name.
func orderPlan(plan []op) *jetflow.Workflow[int, string] {
	run := func(name string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return name, nil }
	}
	return jetflow.NewWorkflow("order", func(ctx *jetflow.Context, amount int) (string, error) {
		var done []string
		for _, o := range plan {
			var err error
			switch o.kind {
			case "step":
				_, err = jetflow.Step(ctx, o.names[0], run(o.names[0]))
			case "group":
				fs := make([]jetflow.Awaitable, 0, len(o.names))
				for _, n := range o.names {
					fs = append(fs, jetflow.Go(ctx, n, run(n)))
				}
				err = jetflow.AwaitAll(ctx, fs...)
			case "child":
				var opts []jetflow.ChildOption
				if len(o.names) > 0 {
					opts = append(opts, jetflow.WithChildRunID(o.names[0]))
				}
				_, err = jetflow.Child(ctx, receipt, amount, opts...).Get(ctx)
			case "sleep":
				err = jetflow.Sleep(ctx, o.names[0], o.d)
			case "event":
				_, err = jetflow.WaitEvent[string](ctx, o.names[0])
			case "panic":
				panic("changed code panics")
			case "loop":
				for {
					if _, err = jetflow.Step(ctx, "poll", run("poll")); err != nil {
						break
					}
				}
			case "block":
				<-ctx.Context().Done()
			}
			if err != nil {
				return "", err
			}
			done = append(done, o.names...)
		}
		return strings.Join(done, ","), nil
	}, jetflow.WithEvent[string]("paid"), jetflow.WithEvent[string]("settled"))
}

// recordGolden runs the golden plan in a real Env and returns its report.
func recordGolden(t *testing.T) jetflowtest.Report {
	t.Helper()
	wf := orderPlan(goldenPlan)
	env := jetflowtest.New(t, wf, receipt)
	h := jetflowtest.Start(env, wf, 42, jetflow.WithRunID("o-1"))
	// An event sent before the body reaches its wait is kept for it.
	ctx, cancel := env.Background()
	defer cancel()
	if _, err := env.Client().SendEvent(ctx, "o-1", "paid", "pay-1", json.RawMessage(`"paid in full"`)); err != nil {
		t.Fatalf("send paid: %v", err)
	}
	if _, err := h.Result(ctx); err != nil {
		t.Fatalf("golden run: %v", err)
	}
	return env.Inspect("o-1")
}

// shape is what a history is compared by across recordings: everything
// but commit times and a sleep's output (its deadline).
func shape(h jetflowtest.History) jetflowtest.History {
	h.Steps = slices.Clone(h.Steps)
	for i := range h.Steps {
		h.Steps[i].CommittedAt = time.Time{}
		if h.Steps[i].Kind == "sleep" {
			h.Steps[i].Output = nil
		}
	}
	return h
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readGolden(t *testing.T) jetflowtest.History {
	t.Helper()
	h, err := jetflowtest.ReadHistory(goldenPath)
	if err != nil {
		t.Fatalf("read the golden history: %v", err)
	}
	return h
}

// TestGoldenHistoryIsCurrent records the golden plan's run in a real Env
// and checks that testdata's golden history is that run (with -update it
// rewrites the file), that the code that made it replays it, and that the
// HTTP API's JSON of the same run reads as the same history.
func TestGoldenHistoryIsCurrent(t *testing.T) {
	t.Parallel()
	r := recordGolden(t)
	fresh := r.History()
	if *update {
		if err := jetflowtest.WriteHistory(goldenPath, fresh); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := mustJSON(t, shape(fresh)), mustJSON(t, shape(readGolden(t))); got != want {
		t.Fatalf("the golden history is not what the order workflow records now (go test -run TestGoldenHistoryIsCurrent -update ./jetflowtest):\nnow:    %s\ngolden: %s", got, want)
	}
	var kinds []string
	for _, s := range fresh.Steps {
		kinds = append(kinds, s.Name+":"+s.Kind)
	}
	if want := "event=paid:event reserve: charge: pack: label: receipt: cool:sleep ship:"; strings.Join(kinds, " ") != want {
		t.Fatalf("golden steps %q, want %q", strings.Join(kinds, " "), want)
	}
	if err := jetflowtest.Replay(orderPlan(goldenPlan), fresh); err != nil {
		t.Fatalf("the unchanged code does not replay its own run: %v", err)
	}
	body, err := json.Marshal(jetflow.RunDescription{Run: r.Run, Steps: r.Steps, OpenSteps: r.Open, Waits: r.Waits})
	if err != nil {
		t.Fatal(err)
	}
	fromHTTP, err := jetflowtest.ParseHistory(body)
	if err != nil {
		t.Fatalf("parse GET /v1/runs/{id}: %v", err)
	}
	ids := func(h jetflowtest.History) (out []string) {
		for _, s := range h.Steps {
			out = append(out, s.StepID)
		}
		return out
	}
	if !fromHTTP.Ranked || !slices.Equal(ids(fromHTTP), ids(fresh)) {
		t.Fatalf("history from the HTTP body: ranked %v, steps %v; want ranked, steps %v", fromHTTP.Ranked, ids(fromHTTP), ids(fresh))
	}
	// Its places are counted without the event's, and replay the same.
	if err := jetflowtest.Replay(orderPlan(goldenPlan), fromHTTP); err != nil {
		t.Fatalf("the unchanged code does not replay the HTTP body's history: %v", err)
	}
	var d *jetflowtest.DivergenceError
	if err := jetflowtest.Replay(orderPlan(replaced(6, step("dispatch"))), fromHTTP); !errors.As(err, &d) || d.Kind != jetflowtest.Renamed || d.History.StepID != "o-1.ship.0" {
		t.Fatalf("a renamed last step against the HTTP body's history: %v", err)
	}
}

// replaced returns the golden plan with the op at i replaced by ops.
func replaced(i int, ops ...op) []op {
	return slices.Concat(goldenPlan[:i], ops, goldenPlan[i+1:])
}

// TestReplayCheck checks changed versions of the order workflow against
// the golden history: each unsafe change is reported where it happens,
// with what the history and the code have there; the safe ones pass.
func TestReplayCheck(t *testing.T) {
	t.Parallel()
	golden := readGolden(t)
	type want struct {
		kind     jetflowtest.DivergenceKind
		pos      int
		hist     string // the history's step at pos ("" none)
		code     string // the code's step at pos ("" none)
		passes   bool
		wantKind string
	}
	cases := []struct {
		name string
		plan []op
		want want
	}{
		{"Unchanged", goldenPlan, want{passes: true}},
		{"StepAddedAtTheEnd", append(slices.Clone(goldenPlan), step("notify")), want{passes: true}},
		{"SleepDurationChanged", replaced(4, sleep("cool", time.Hour)), want{passes: true}},
		{"ParallelGroupReordered", replaced(2, group("label", "pack")), want{passes: true}},
		{"StepRenamed", replaced(1, step("charge_card")), want{kind: jetflowtest.Renamed, pos: 1, hist: "o-1.charge.0", code: "o-1.charge_card.0"}},
		{"StepRemoved", replaced(1), want{kind: jetflowtest.Removed, pos: 1, hist: "o-1.charge.0", code: "o-1.pack.0"}},
		{"SequentialPairReordered", slices.Concat([]op{step("charge"), step("reserve")}, goldenPlan[2:]), want{kind: jetflowtest.Reordered, pos: 0, hist: "o-1.reserve.0", code: "o-1.charge.0"}},
		{"StepInsertedBefore", slices.Concat(goldenPlan[:1], []op{step("audit")}, goldenPlan[1:]), want{kind: jetflowtest.Inserted, pos: 1, hist: "o-1.charge.0", code: "o-1.audit.0"}},
		{"ParallelGroupMadeSequentialReordered", replaced(2, step("label"), step("pack")), want{kind: jetflowtest.Reordered, pos: 2, hist: "o-1.pack.0", code: "o-1.label.0"}},
		{"SleepBecameStep", replaced(4, step("cool")), want{kind: jetflowtest.KindChanged, pos: 5, hist: "o-1.cool.0", code: "o-1.cool.0", wantKind: "step"}},
		{"EventRenamed", replaced(5, event("settled")), want{kind: jetflowtest.Renamed, pos: 6, hist: "o-1.event=paid.0", code: "o-1.event=settled.0"}},
		{"EventRemoved", replaced(5), want{kind: jetflowtest.Removed, pos: 6, hist: "o-1.event=paid.0", code: "o-1.ship.0"}},
		{"LastStepRemoved", goldenPlan[:6], want{kind: jetflowtest.Removed, pos: 7, hist: "o-1.ship.0", code: ""}},
		{"ChildRunIDChanged", replaced(3, op{kind: "child", names: []string{"receipt-o-1"}}), want{kind: jetflowtest.ChildChanged, pos: 4, hist: "o-1.receipt.0", code: "o-1.receipt.0"}},
		{"Panics", replaced(3, op{kind: "panic"}), want{kind: jetflowtest.Panicked, pos: 4}},
		{"LoopsOverNewSteps", replaced(1, op{kind: "loop"}), want{kind: jetflowtest.Unbounded, pos: 1, hist: "o-1.charge.0", code: "o-1.poll.0"}},
		{"LoopsAfterTheLastStep", append(slices.Clone(goldenPlan), op{kind: "loop"}), want{passes: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := jetflowtest.Replay(orderPlan(tc.plan), golden)
			if tc.want.passes {
				if err != nil {
					t.Fatalf("Replay = %v, want nil", err)
				}
				return
			}
			var d *jetflowtest.DivergenceError
			if !errors.As(err, &d) {
				t.Fatalf("Replay = %v, want a *DivergenceError", err)
			}
			id := func(s *jetflowtest.ReplayStep) string {
				if s == nil {
					return ""
				}
				return s.StepID
			}
			if d.Kind != tc.want.kind || d.Position != tc.want.pos || id(d.History) != tc.want.hist || id(d.Code) != tc.want.code {
				t.Fatalf("Replay = %v\nwant %s at %d, history %q, code %q", err, tc.want.kind, tc.want.pos, tc.want.hist, tc.want.code)
			}
			if tc.want.wantKind != "" && d.Code.Kind != tc.want.wantKind {
				t.Fatalf("code step kind %q, want %q", d.Code.Kind, tc.want.wantKind)
			}
			if d.Workflow != "order" || d.RunID != "o-1" || !strings.Contains(err.Error(), string(tc.want.kind)) {
				t.Fatalf("error %q does not name the run and the kind", err)
			}
		})
	}
}

// TestReplayBoundsABodyThatNeverReturns: a body blocked on something else
// than steps is given up on after the replay's timeout, its context
// cancelled.
func TestReplayBoundsABodyThatNeverReturns(t *testing.T) {
	t.Parallel()
	timeout := 200 * time.Millisecond
	start := time.Now()
	err := jetflowtest.Replay(orderPlan(replaced(2, op{kind: "block"})), readGolden(t), jetflowtest.WithReplayTimeout(timeout))
	var d *jetflowtest.DivergenceError
	if !errors.As(err, &d) || d.Kind != jetflowtest.TimedOut {
		t.Fatalf("Replay = %v, want %s", err, jetflowtest.TimedOut)
	}
	if took := time.Since(start); took < timeout {
		t.Fatalf("gave up after %s, before the timeout %s", took, timeout)
	}
}

// TestReplayInputChanged: a run's input that the changed code's input type
// cannot decode is reported, not taken for a body's failure.
func TestReplayInputChanged(t *testing.T) {
	t.Parallel()
	wf := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, in struct{ Amount int }) (string, error) {
		return jetflow.Step(ctx, "reserve", func(context.Context) (string, error) { return "reserve", nil })
	})
	var d *jetflowtest.DivergenceError
	if err := jetflowtest.Replay(wf, readGolden(t)); !errors.As(err, &d) || d.Kind != jetflowtest.InputChanged {
		t.Fatalf("Replay = %v, want %s", err, jetflowtest.InputChanged)
	}
}

// TestHistoryFileRoundTripsAndRefusesBadInput: WriteHistory and
// ReadHistory give back the same History, and a file that is not a
// history of the workflow is ErrInvalidHistory.
func TestHistoryFileRoundTripsAndRefusesBadInput(t *testing.T) {
	t.Parallel()
	golden := readGolden(t)
	path := filepath.Join(t.TempDir(), "h.json")
	if err := jetflowtest.WriteHistory(path, golden); err != nil {
		t.Fatal(err)
	}
	again, err := jetflowtest.ReadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if mustJSON(t, again) != mustJSON(t, golden) {
		t.Fatalf("round trip changed the history:\n%s\n%s", mustJSON(t, again), mustJSON(t, golden))
	}
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(from, to string) []byte {
		if !strings.Contains(string(written), from) {
			t.Fatalf("the history file holds no %q", from)
		}
		return []byte(strings.Replace(string(written), from, to, 1))
	}
	for name, b := range map[string][]byte{
		"NotJSON":        []byte("{"),
		"OtherFormat":    edit(`"jetflow-history/1"`, `"jetflow-history/9"`),
		"ForeignStep":    edit(`"o-1.charge.0"`, `"o-2.charge.0"`),
		"TwoAtOnePlace":  edit(`"seq": 2`, `"seq": 1`),
		"TrailingData":   append(slices.Clone(written), []byte("{}")...),
		"NoWorkflowName": edit(`"workflow": "order"`, `"workflow": ""`),
	} {
		if _, err := jetflowtest.ParseHistory(b); !errors.Is(err, jetflowtest.ErrInvalidHistory) {
			t.Errorf("%s: ParseHistory = %v, want ErrInvalidHistory", name, err)
		}
	}
	if err := jetflowtest.Replay(receipt, golden); !errors.Is(err, jetflowtest.ErrInvalidHistory) {
		t.Fatalf("Replay of another workflow's history = %v, want ErrInvalidHistory", err)
	}
}

// inFlight is golden as a history taken while the run was in its parallel
// group: pack not committed yet, label committed, nothing after.
func inFlight(t *testing.T) jetflowtest.History {
	h := readGolden(t)
	h.Status = jetflow.StatusRunning
	h.Steps = slices.DeleteFunc(h.Steps, func(s jetflowtest.HistoryStep) bool {
		return s.Name == "pack" || s.Seq > 3 || s.Seq < 0
	})
	if len(h.Steps) != 3 {
		t.Fatalf("in-flight history %+v", h.Steps)
	}
	return h
}

// TestReplayOfARunInFlight: a history with a step of a parallel group not
// committed yet replays with the group in any order and steps added after
// it, and still reports a renamed step.
func TestReplayOfARunInFlight(t *testing.T) {
	t.Parallel()
	h := inFlight(t)
	for name, plan := range map[string][]op{
		"Unchanged":      goldenPlan,
		"GroupReordered": replaced(2, group("label", "pack")),
		"ShipRenamed":    replaced(6, step("dispatch")), // not reached yet: a change for this run
	} {
		if err := jetflowtest.Replay(orderPlan(plan), h); err != nil {
			t.Errorf("%s: Replay = %v, want nil", name, err)
		}
	}
	var d *jetflowtest.DivergenceError
	if err := jetflowtest.Replay(orderPlan(replaced(2, group("pack", "labels"))), h); !errors.As(err, &d) || d.Kind != jetflowtest.Renamed || d.Position != 3 {
		t.Fatalf("a renamed committed step of the group: %v", err)
	}
}

// TestReplayAwaitFirstFollowsTheCommitOrder: AwaitFirst's winner in the
// check is the step the history committed first, as in the engine.
func TestReplayAwaitFirstFollowsTheCommitOrder(t *testing.T) {
	t.Parallel()
	run := func(name string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return name, nil }
	}
	wf := jetflow.NewWorkflow("race", func(ctx *jetflow.Context, _ int) (string, error) {
		fs := []jetflow.Awaitable{jetflow.Go(ctx, "a", run("a")), jetflow.Go(ctx, "b", run("b"))}
		won, err := jetflow.AwaitFirst(ctx, fs...)
		if err != nil {
			return "", err
		}
		return jetflow.Step(ctx, "after-"+[]string{"a", "b"}[won], run("after"))
	})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	history := func(aFirst bool) jetflowtest.History {
		at := func(first bool) time.Time {
			if first {
				return t0
			}
			return t0.Add(time.Second)
		}
		return jetflowtest.History{Format: jetflowtest.HistoryFormat, Workflow: "race", RunID: "r-1", Input: json.RawMessage("1"),
			Steps: []jetflowtest.HistoryStep{
				{Seq: 0, StepID: "r-1.a.0", Name: "a", Output: json.RawMessage(`"a"`), CommittedAt: at(aFirst)},
				{Seq: 1, StepID: "r-1.b.0", Name: "b", Output: json.RawMessage(`"b"`), CommittedAt: at(!aFirst)},
				{Seq: 2, StepID: "r-1.after-b.0", Name: "after-b", Output: json.RawMessage(`"after"`), CommittedAt: t0.Add(2 * time.Second)},
			}}
	}
	if err := jetflowtest.Replay(wf, history(false)); err != nil {
		t.Fatalf("b committed first: Replay = %v", err)
	}
	var d *jetflowtest.DivergenceError
	if err := jetflowtest.Replay(wf, history(true)); !errors.As(err, &d) || d.Kind != jetflowtest.Renamed || d.Code.Name != "after-a" {
		t.Fatalf("a committed first: Replay = %v, want after-a in place of after-b", err)
	}
}

// TestReplayCallsNoStepFunction: the check replays committed results and
// gives new steps zero values; no step function runs, not even one the
// history does not hold.
func TestReplayCallsNoStepFunction(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	count := func(context.Context) (string, error) {
		calls.Add(1)
		return "called", nil
	}
	var got []string
	wf := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, _ int) (string, error) {
		got = got[:0]
		for _, name := range []string{"reserve", "charge", "refund"} {
			out, err := jetflow.Step(ctx, name, count)
			if err != nil {
				return "", err
			}
			got = append(got, out)
		}
		return "", nil
	})
	h := readGolden(t)
	h.Steps = slices.DeleteFunc(h.Steps, func(s jetflowtest.HistoryStep) bool { return s.Seq < 0 || s.Seq > 1 })
	if err := jetflowtest.Replay(wf, h); err != nil {
		t.Fatalf("Replay = %v", err)
	}
	if n := calls.Load(); n != 0 || !slices.Equal(got, []string{"reserve", "charge", ""}) {
		t.Fatalf("step functions called %d times, results %q; want none, the committed results and a zero value", n, got)
	}
}

// fakeT records what the kit reports through it.
type fakeT struct {
	*testing.T
	fatal string
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// New dry-runs each workflow before it starts anything and fails the test
// with every misuse of the body on the way: a step from a goroutine of its
// own, a wait for an undeclared event, steps never awaited; a correct
// workflow passes.
func TestNewReportsMisuse(t *testing.T) {
	t.Parallel()
	fn := func(context.Context) (string, error) { return "", nil }
	for _, tc := range []struct {
		name string
		wf   *jetflow.Workflow[int, string]
		want string
	}{
		{"goroutine", jetflow.NewWorkflow("g", func(ctx *jetflow.Context, in int) (string, error) {
			done := make(chan error)
			go func() { _, err := jetflow.Step(ctx, "s", fn); done <- err }()
			return "", <-done
		}), "goroutine other than the workflow body's"},
		{"undeclared event", jetflow.NewWorkflow("e", func(ctx *jetflow.Context, in int) (string, error) {
			return jetflow.WaitEvent[string](ctx, "paid")
		}), `does not declare event "paid"`},
		{"never awaited", jetflow.NewWorkflow("u", func(ctx *jetflow.Context, in int) (string, error) {
			jetflow.Go(ctx, "lost", fn)
			return "", nil
		}), "dry-run.lost.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := jetflowtest.DryRun(tc.wf)
			require.ErrorIs(t, err, jetflowtest.ErrMisuse)
			require.ErrorContains(t, err, tc.want)
			ft := &fakeT{T: t}
			done := make(chan struct{})
			go func() { defer close(done); jetflowtest.New(ft, tc.wf) }()
			<-done
			require.Contains(t, ft.fatal, tc.want)
		})
	}
	ok := jetflow.NewWorkflow("ok", func(ctx *jetflow.Context, in int) (string, error) {
		f := jetflow.Go(ctx, "a", fn)
		return f.Get(ctx)
	})
	require.NoError(t, jetflowtest.DryRun(ok))
}
