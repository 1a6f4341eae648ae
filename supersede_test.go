package jetflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
)

// superseding is a workflow of steps "a" then "b" under the conflict
// policy Supersede. Each step records its start (time, by step ID) in
// starts; "a" then signals started and waits for release. The output is
// the input.
type superseding struct {
	wf      *Workflow[int, int]
	started chan string
	release chan struct{}
	open    sync.Once

	mu     sync.Mutex
	starts map[string][]time.Time
}

func newSuperseding(name string) *superseding {
	s := &superseding{started: make(chan string, 64), release: make(chan struct{}), starts: map[string][]time.Time{}}
	s.wf = NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		for _, step := range []string{"a", "b"} {
			if _, err := Step(ctx, step, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				s.mu.Lock()
				s.starts[info.StepID] = append(s.starts[info.StepID], time.Now())
				s.mu.Unlock()
				if step == "a" {
					s.started <- info.StepID
					<-s.release
				}
				return in, nil
			}); err != nil {
				return 0, err
			}
		}
		return in, nil
	}, WithDefaultConflictPolicy(ConflictPolicy{WhileRunning: Supersede}))
	return s
}

// running starts the workflow's env, worker and client, and a run runID
// with input 1 whose first generation's step a has started.
func (s *superseding) running(t *testing.T, runID string) (*Client, *Handle[int], context.Context) {
	t.Helper()
	env := newEnv(t, Topology{})
	env.worker(WorkerConfig{}, s.wf)
	t.Cleanup(s.releaseAll)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	h, err := Start(ctx, c, s.wf, 1, WithRunID(runID))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	require.Equal(t, runID+".a.0", <-s.started)
	return c, h, ctx
}

// releaseAll lets every step "a" that waits, or will, go on. running
// calls it at cleanup too, before the worker is stopped: a test that
// failed before releasing them leaves no step blocked.
func (s *superseding) releaseAll() { s.open.Do(func() { close(s.release) }) }

// startsOf are the start times of step stepID.
func (s *superseding) startsOf(stepID string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.starts[stepID]...)
}

// tasksSettled waits until every task of workflow delivered so far (start
// and step tasks) has been settled and none is pending: the tasks of a
// superseded generation have been dropped, or run.
func tasksSettled(t *testing.T, c *Client, workflow string) {
	t.Helper()
	for _, kind := range []jetstream.TaskKind{jetstream.RunTasks, jetstream.BranchTasks} {
		cons, err := c.assets.JS.Consumer(t.Context(), jetstream.TasksStream, jetstream.ConsumerName(workflow, kind))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			info, err := cons.Info(t.Context())
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, 30*time.Second, 10*time.Millisecond, "the tasks of %s were not settled", workflow)
	}
}

// A start with another input supersedes the running generation: it is
// cancelled (its handle says so, its next step never starts) and the new
// generation runs with the new input. A start with the running
// generation's own input attaches; under Attach, strict fingerprints
// refuse another input.
func TestSupersedeReplacesTheRunningGeneration(t *testing.T) {
	t.Parallel()
	s := newSuperseding("sup")
	c, h0, ctx := s.running(t, "sup-1")

	same, err := Start(ctx, c, s.wf, 1, WithRunID("sup-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeExisting, same.Outcome, "the same input is a retry: it attaches")
	require.Equal(t, 0, same.Generation)

	_, err = Start(ctx, c, s.wf, 2, WithRunID("sup-1"), WithConflictPolicy(ConflictPolicy{}))
	require.ErrorIs(t, err, ErrIdempotencyConflict, "under Attach, strict fingerprints refuse another input")

	h1, err := Start(ctx, c, s.wf, 2, WithRunID("sup-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeSuperseded, h1.Outcome)
	require.Equal(t, 1, h1.Generation)
	require.Equal(t, StatusRunning, h1.Status)

	_, err = h0.Result(ctx)
	requireSuperseded(t, err)

	require.Equal(t, "sup-1/1.a.0", <-s.started)
	s.releaseAll()
	out, err := h1.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, out)
	tasksSettled(t, c, "sup")
	require.Empty(t, s.startsOf("sup-1.b.0"), "a step of the superseded generation started")
	require.Len(t, s.startsOf("sup-1/1.b.0"), 1)

	run, err := c.WaitRun(ctx, "sup-1")
	require.NoError(t, err)
	require.Equal(t, 1, run.Generation)
	require.EqualValues(t, 3, run.Duplicates)
	var outcomes []string
	for _, d := range run.RecentDuplicates {
		outcomes = append(outcomes, fmt.Sprintf("%s@%d", d.Outcome, d.Generation))
	}
	require.Equal(t, []string{"existing@0", "conflict@0", "superseded@1"}, outcomes, "every start's outcome, the refused one too")
}

// Twenty superseding starts of one running run, at once, each with its own
// input: every one is answered, each generation is started by exactly one
// of them, one generation is running when they have returned, every
// superseded one is cancelled (its handles say so), and no step of a
// superseded generation starts after its cancel was recorded, but for the
// one whose cancel check was already passed.
func TestConcurrentSupersedingStartsLeaveOneGeneration(t *testing.T) {
	t.Parallel()
	s := newSuperseding("sup-race")
	c, h0, ctx := s.running(t, "race-1")
	var (
		mu        sync.Mutex
		cancelled = map[int]time.Time{} // generation -> when its cancel was written
	)
	c.admit.SetHooks(dedupe.Hooks{AfterSupersede: func(run state.Run) {
		mu.Lock()
		defer mu.Unlock()
		_, again := cancelled[run.Generation]
		require.False(t, again, "generation %d cancelled twice", run.Generation)
		cancelled[run.Generation] = time.Now()
	}})
	const n = 20
	handles := make([]*Handle[int], n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			handles[i], errs[i] = Start(ctx, c, s.wf, 100+i, WithRunID("race-1"))
		}()
	}
	wg.Wait()

	byGeneration := map[int]int{} // generation -> the input of the start that made it
	for i := range n {
		require.NoError(t, errs[i], "start %d", i)
		require.Equal(t, OutcomeSuperseded, handles[i].Outcome, "start %d: each input is new", i)
		_, dup := byGeneration[handles[i].Generation]
		require.False(t, dup, "generation %d started twice", handles[i].Generation)
		byGeneration[handles[i].Generation] = 100 + i
	}
	run, err := c.GetRun(ctx, "race-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)
	require.Equal(t, n, run.Generation, "one generation per superseding start, none skipped")
	require.EqualValues(t, n, run.Duplicates)
	for g := 1; g <= n; g++ {
		require.Contains(t, byGeneration, g)
	}
	mu.Lock()
	require.Len(t, cancelled, n, "every generation but the last was cancelled once")
	mu.Unlock()

	s.releaseAll()
	out, err := handlesOf(handles, n).Result(ctx)
	require.NoError(t, err)
	require.Equal(t, byGeneration[n], out, "the running generation has its own start's input")
	for i, h := range append(handles, h0) {
		if h.Generation == n {
			continue
		}
		_, err := h.Result(ctx)
		requireSuperseded(t, err, "handle %d of generation %d", i, h.Generation)
	}

	// Every generation whose step a started, but the last, has its step b
	// dropped, never started; step a started after its generation's
	// cancel only when its cancel check came first.
	tasksSettled(t, c, "sup-race")
	for g := 0; g < n; g++ {
		prefix := "race-1"
		if g > 0 {
			prefix = fmt.Sprintf("race-1/%d", g)
		}
		a := s.startsOf(prefix + ".a.0")
		if len(a) == 0 {
			continue
		}
		require.Empty(t, s.startsOf(prefix+".b.0"), "generation %d: step b started", g)
		mu.Lock()
		at := cancelled[g]
		mu.Unlock()
		late := 0
		for _, t0 := range a {
			if t0.After(at) {
				late++
			}
		}
		require.LessOrEqual(t, late, 1, "generation %d: step a started after its cancel", g)
	}
}

// requireSuperseded checks the answer of Handle.Result for a superseded
// generation: its cancellation when the handle read it, or ErrRunReplaced
// when the record already held the newer generation.
func requireSuperseded(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	if errors.Is(err, ErrRunReplaced) {
		return
	}
	var re *RunError
	require.ErrorAs(t, err, &re, msgAndArgs...)
	require.Equal(t, StatusCancelled, re.Status, msgAndArgs...)
	require.Equal(t, CodeSuperseded, re.Code, msgAndArgs...)
}

// handlesOf is the handle of generation gen among hs.
func handlesOf(hs []*Handle[int], gen int) *Handle[int] {
	for _, h := range hs {
		if h.Generation == gen {
			return h
		}
	}
	return nil
}

// A superseding start that died after it cancelled the running generation
// and before it started its own: the next superseding start finishes the
// job, and its outcome says it superseded.
func TestSupersedeInterruptedIsFinishedByTheNextStart(t *testing.T) {
	t.Parallel()
	s := newSuperseding("sup-crash")
	c, _, ctx := s.running(t, "crash-1")

	// A start that dies right after its cancel was written: its context
	// ends there, so nothing after the cancel happens.
	dying, die := context.WithCancel(ctx)
	c.admit.SetHooks(dedupe.Hooks{AfterSupersede: func(state.Run) { die() }})
	_, err := Start(dying, c, s.wf, 2, WithRunID("crash-1"))
	require.Error(t, err)
	run, err := c.GetRun(ctx, "crash-1")
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, run.Status)
	require.Equal(t, 0, run.Generation)

	c.admit.SetHooks(dedupe.Hooks{})
	h, err := Start(ctx, c, s.wf, 3, WithRunID("crash-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeSuperseded, h.Outcome)
	require.Equal(t, 1, h.Generation)
	s.releaseAll()
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, out)
}

// StartByName admits in a worker: a superseding start asked of a worker
// cancels and replaces the running generation the same way.
func TestSupersedeByName(t *testing.T) {
	t.Parallel()
	s := newSuperseding("sup-name")
	c, _, ctx := s.running(t, "name-1")
	res, err := c.StartByName(ctx, "sup-name", []byte(`7`), WithRunID("name-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeSuperseded, res.Outcome)
	require.Equal(t, 1, res.Generation)
	require.Equal(t, "name-1/1.a.0", <-s.started)
	s.releaseAll()
	run, err := c.WaitRun(ctx, "name-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, run.Status)
	require.JSONEq(t, `7`, string(run.Output))
}

// A child linked by the superseded generation and admitted only after the
// supersede (whose cancel found no child to cancel yet) is cancelled by the
// step that admitted it, not left to run on.
func TestSupersededGenerationsLateChildIsCancelled(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	kidStarted := make(chan string, 4)
	kid := NewWorkflow("sup-kid", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "work", func(sctx context.Context) (int, error) {
			kidStarted <- ctx.RunID()
			<-sctx.Done() // until cancelled, or the worker stops
			return 0, sctx.Err()
		})
	})
	parent := NewWorkflow("sup-parent", func(ctx *Context, in int) (int, error) {
		return Child(ctx, kid, in).Get(ctx)
	}, WithDefaultConflictPolicy(ConflictPolicy{WhileRunning: Supersede}))
	linked, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	env.worker(WorkerConfig{hooks: workflow.Hooks{BeforeChildAdmit: func(string, string) {
		once.Do(func() { close(linked); <-proceed }) // the first generation's child only
	}}}, parent, kid)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h0, err := Start(ctx, c, parent, 1, WithRunID("pk-1"))
	require.NoError(t, err)
	<-linked
	h1, err := Start(ctx, c, parent, 2, WithRunID("pk-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeSuperseded, h1.Outcome)
	close(proceed)

	_, err = h0.Result(ctx)
	requireSuperseded(t, err)
	// The superseded generation's child: admitted once the parked step
	// goes on, then cancelled by that step.
	require.Eventually(t, func() bool {
		orphan, err := c.GetRun(ctx, "pk-1=sup-kid=0")
		return err == nil && orphan.Status == StatusCancelled
	}, 20*time.Second, 10*time.Millisecond, "the superseded generation's child is cancelled")
	run, err := c.GetRun(ctx, "pk-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status, "the new generation's child still runs")
	require.Equal(t, 1, run.Generation)
	out, err := c.CancelRun(ctx, "pk-1") // ends the new generation's child too, so the worker drains
	require.NoError(t, err)
	require.Equal(t, []string{"pk-1=sup-kid=0=g1"}, out.Children)
}

// A handle keeps its first final answer: after a StartNew restart of the
// run ID its Result still returns the output it returned before, and a
// handle that read nothing before the restart says its generation was
// replaced.
func TestHandleResultSurvivesARestart(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	wf := NewWorkflow("sn-keep", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "a", func(context.Context) (int, error) { return in, nil })
	}, WithDefaultConflictPolicy(ConflictPolicy{AfterCompleted: StartNew}))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	h0, err := Start(ctx, c, wf, 1, WithRunID("keep-1"))
	require.NoError(t, err)
	// A second handle of generation 0 that reads nothing until the end.
	unread := &Handle[int]{RunID: h0.RunID, Generation: h0.Generation, client: c, memo: &handleMemo[int]{}}
	out, err := h0.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, out)

	h1, err := Start(ctx, c, wf, 2, WithRunID("keep-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeRestarted, h1.Outcome)
	out, err = h1.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, out)

	out, err = h0.Result(ctx)
	require.NoError(t, err, "the same answer again")
	require.Equal(t, 1, out)
	_, err = unread.Result(ctx)
	require.ErrorIs(t, err, ErrRunReplaced)
}
