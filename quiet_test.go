package jetflow

// Nothing that changes nothing wakes a run: a refused or duplicate start,
// a repeated event or hook resume, a start task published late cost no
// task publish and no replay of the body. Each test watches the task
// subjects with a tap of its own (a core NATS subscription, which sees a
// publish whether or not the stream stores it) and counts the body's
// replays.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// newTaskTap records every publish on the run and branch task subjects,
// on a connection of its own.
func newTaskTap(t *testing.T, env *testEnv) *testenv.Tap {
	t.Helper()
	return testenv.NewTap(t, env.conn(), jetstream.RunSubjects, jetstream.BranchSubjects)
}

// subjects are the subjects and message IDs of msgs.
func subjects(msgs []*nats.Msg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Subject + " " + m.Header.Get(natsjs.MsgIDHeader)
	}
	return out
}

// awaitParked waits until the run generation identity's lease says the
// body is parked waiting for stepID, and returns the lease's revision.
func awaitParked(t *testing.T, c *Client, identity, stepID string) uint64 {
	t.Helper()
	var rev uint64
	require.Eventually(t, func() bool {
		v, r, err := c.assets.Steps.Get(context.Background(), state.LeaseKey(identity))
		if err != nil {
			return false
		}
		l, err := state.DecodeLease(v)
		rev = r
		return err == nil && l.State == state.LeaseParked && slices.Contains(l.Waits, stepID)
	}, 20*time.Second, 5*time.Millisecond, "run %s never parked on %s", identity, stepID)
	return rev
}

// leaseRev is the revision of the run generation identity's lease.
func leaseRev(t *testing.T, c *Client, identity string) uint64 {
	t.Helper()
	_, rev, err := c.assets.Steps.Get(ctxT(t, 5*time.Second), state.LeaseKey(identity))
	require.NoError(t, err)
	return rev
}

// runTasks is how many tasks the run subject of runID (workflow wf, first
// generation) holds.
func runTasks(t *testing.T, c *Client, wf, runID string) uint64 {
	t.Helper()
	info, err := c.assets.Tasks.Info(ctxT(t, 5*time.Second), natsjs.WithSubjectFilter(jetstream.RunSubject(wf, runID)))
	require.NoError(t, err)
	return info.State.Msgs
}

// awaitWindowPassed waits until the broker's duplicate window has
// forgotten every message ID published before the call. It stores a probe
// under an ID of its own (on a subject of an earlier engine's, kept in the
// task stream and consumed by nobody; the probe is removed at once), then
// publishes under that ID again until the broker stores it instead of
// refusing it as a duplicate: the window forgets IDs in the order they
// came, so the IDs published before the probe's are gone by then.
func awaitWindowPassed(t *testing.T, c *Client) {
	t.Helper()
	id := "probe-" + nuid.Next()
	subject := "jetflow.task.probe." + id
	probe := func() (stored bool) {
		ack, err := c.assets.JS.Publish(context.Background(), subject, nil, natsjs.WithMsgID(id))
		if err != nil || ack.Duplicate {
			return false
		}
		require.NoError(t, c.assets.Tasks.DeleteMsg(context.Background(), ack.Sequence))
		return true
	}
	require.True(t, probe(), "the probe's first publish was refused")
	require.Eventually(t, probe, 20*time.Second, 10*time.Millisecond, "the broker's window never forgot the probe")
}

// publishEarlierStart stores the start task of runID (workflow wf) that
// a producer of the previous version published for every start,
// duplicates too, before it read the run's record: a token of its own, the
// run ID as its message ID. It publishes until the broker stores it (past
// the window that holds the run ID; the run's subject must be free).
func publishEarlierStart(t *testing.T, c *Client, wf, runID string, input json.RawMessage) {
	t.Helper()
	b, err := state.Encode(state.Task{V: state.Version, RunID: runID, Workflow: wf, Input: input, Token: nuid.Next()})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		d, err := jetstream.PublishTask(context.Background(), c.assets.JS, jetstream.RunSubject(wf, runID), runID, b)
		return err == nil && d == jetstream.Stored
	}, 20*time.Second, 10*time.Millisecond, "the start task of %s was never stored", runID)
}

// replayCounter counts the replays of bodies, by run ID.
type replayCounter struct{ *counter }

func (r replayCounter) replayed(ctx *Context) { r.inc(ctx.RunID()) }

// G25: 1,000 duplicate starts, after the broker's window, of two runs
// parked on an event wait and on a long sleep — half of them refused by
// the conflict policy (RejectWhileRunning), half answered "existing" —
// publish no task and wake neither run: the tap sees no publish on a task
// subject, the runs' leases keep their revisions, their bodies are not
// replayed, and each run counts its 500 duplicates.
func TestRefusedDuplicateStartsWakeNothing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: 100 * time.Millisecond})
	replays := replayCounter{newCounter()}
	wf := NewWorkflow("parked", func(ctx *Context, nap time.Duration) (int, error) {
		replays.replayed(ctx)
		if nap > 0 {
			return 1, Sleep(ctx, "nap", nap)
		}
		_, err := WaitEvent[string](ctx, "go")
		return 2, err
	}, WithEvent[string]("go"))
	wnc := env.conn()
	w := startWorker(t, wnc, WorkerConfig{Topology: env.topo}, wf)
	stopAtEnd(t, w, 10*time.Second)
	c := env.client()
	ctx := ctxT(t, 120*time.Second)

	runs := map[string]time.Duration{"on-event": 0, "on-sleep": time.Hour}
	waits := map[string]string{"on-event": "on-event.event=go.0", "on-sleep": "on-sleep.nap.0"}
	leases := map[string]uint64{}
	for id, nap := range runs {
		h, err := Start(ctx, c, wf, nap, WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, h.Outcome)
		leases[id] = awaitParked(t, c, id, waits[id])
	}
	awaitWindowPassed(t, c)
	tap := newTaskTap(t, env)

	const n = 1000
	reject := WithConflictPolicy(ConflictPolicy{WhileRunning: RejectWhileRunning})
	ids := []string{"on-event", "on-sleep"}
	var wg sync.WaitGroup
	errc := make(chan error, n)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				id := ids[i%2]
				opts := []StartOption{WithRunID(id)}
				if i%4 < 2 {
					opts = append(opts, reject)
				}
				h, err := Start(ctx, c, wf, runs[id], opts...)
				switch {
				case i%4 < 2 && !errors.Is(err, ErrDuplicateRejected):
					errc <- fmt.Errorf("start %d of %s: %v, want it rejected", i, id, err)
				case i%4 >= 2 && (err != nil || h.Outcome != OutcomeExisting):
					errc <- fmt.Errorf("start %d of %s: %v, want existing", i, id, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}

	require.Empty(t, subjects(tap.Seen(c.nc, wnc)), "a duplicate start published a task")
	for _, id := range ids {
		require.Zero(t, runTasks(t, c, "parked", id), "a task of %s is stored", id)
		require.Equal(t, leases[id], leaseRev(t, c, id), "the lease of %s was written", id)
		require.Equal(t, 1, replays.get(id), "the body of %s was replayed", id)
		run, err := c.GetRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, StatusRunning, run.Status)
		require.Equal(t, int64(n/2), run.Duplicates)
	}
}

// G25: an event sent 100 times, and a hook resumed 100 times, wake the
// run once each: the first delivery's wake. Every repeat is a duplicate,
// finds the run parked elsewhere or its wake stored, and publishes
// nothing; the body is replayed once per wake.
func TestRepeatedEventsWakeTheRunOnce(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	replays := replayCounter{newCounter()}
	effects := newCounter()
	wf := NewWorkflow("repeated", func(ctx *Context, _ int) (string, error) {
		replays.replayed(ctx)
		got, err := WaitEvent[string](ctx, "go")
		if err != nil {
			return "", err
		}
		ok, err := WaitEvent[string](ctx, "approval", WithHookToken("tok-repeated"))
		if err != nil {
			return "", err
		}
		if _, err := Step(ctx, "after", func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return 1, nil
		}); err != nil {
			return "", err
		}
		_, err = WaitEvent[string](ctx, "never")
		return got + ok, err
	}, WithEvent[string]("go"), WithEvent[string]("approval"), WithEvent[string]("never"))
	wnc := env.conn()
	w := startWorker(t, wnc, WorkerConfig{Topology: env.topo}, wf)
	stopAtEnd(t, w, 10*time.Second)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	_, err := Start(ctx, c, wf, 0, WithRunID("rep-1"))
	require.NoError(t, err)
	awaitParked(t, c, "rep-1", "rep-1.event=go.0")
	tap := newTaskTap(t, env)

	const n = 100
	for i := range n {
		res, err := c.SendEvent(ctx, "rep-1", "go", "go-1", json.RawMessage(`"go"`))
		require.NoError(t, err)
		require.Equal(t, i > 0, res.Outcome == EventDuplicate, "send %d: %s", i, res.Outcome)
	}
	awaitParked(t, c, "rep-1", "rep-1.hook=approval.0")
	for i := 0; i < n; {
		res, err := c.Resume(ctx, "tok-repeated", "ok-1", json.RawMessage(`"ok"`))
		if i == 0 && errors.Is(err, ErrHookNotFound) {
			continue // the token is recorded once the run reaches its wait
		}
		require.NoError(t, err)
		require.Equal(t, i > 0, res.Outcome == EventDuplicate, "resume %d: %s", i, res.Outcome)
		i++
	}
	awaitParked(t, c, "rep-1", "rep-1.event=never.0")

	// One wake per event. A wake the stream refused while the parked
	// holder's acknowledged task was still stored is published again
	// under its own message ID (Wake waits that task out; under load the
	// removal lags): the same wake, seen twice in a row by the tap.
	require.Equal(t, []string{
		"jetflow.run.repeated.rep-1 rep-1.event=go.0.wake",
		"jetflow.run.repeated.rep-1 rep-1.hook=approval.0.wake",
	}, slices.Compact(subjects(tap.Seen(c.nc, wnc))), "one wake per event")
	require.Equal(t, 3, replays.get("rep-1"), "the start and one replay per wake")
	require.Equal(t, 1, effects.get("rep-1.after.0"))
}

// G25, and nothing accepted is lost: a start that dies between the run's
// record and its start task (here, stalls there for good) leaves a
// running run with no task, which the sweeper wakes: the run goes on, each
// step once. The stalled start's task, published when it resumes after
// the run was parked, is dropped without a replay and runs nothing again.
func TestStartStalledBetweenRecordAndStartTask(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	replays := replayCounter{newCounter()}
	effects := newCounter()
	step := func(ctx *Context, name string) error {
		_, err := Step(ctx, name, func(sctx context.Context) (int, error) {
			info, _ := StepDetailsFrom(sctx)
			effects.inc(info.StepID)
			return 1, nil
		})
		return err
	}
	wf := NewWorkflow("stalled", func(ctx *Context, _ int) (int, error) {
		replays.replayed(ctx)
		if err := step(ctx, "a"); err != nil {
			return 0, err
		}
		if _, err := WaitEvent[string](ctx, "go"); err != nil {
			return 0, err
		}
		return 2, step(ctx, "b")
	}, WithEvent[string]("go"))
	// StuckAfter is the least allowed (3 × AckWait).
	env.worker(WorkerConfig{AckWait: 500 * time.Millisecond, SweepInterval: 20 * time.Millisecond, StuckAfter: 1500 * time.Millisecond}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)

	admit := dedupe.New(c.assets, dedupe.Config{})
	stalled, resume := make(chan struct{}), make(chan struct{})
	admit.SetHooks(dedupe.Hooks{BeforeStartPublished: func(string) {
		close(stalled)
		<-resume
	}})
	done := make(chan error, 1)
	go func() {
		res, err := admit.Admit(ctx, dedupe.Request{RunID: "st-1", Workflow: "stalled", Input: json.RawMessage(`0`)})
		if err == nil && res.Outcome != dedupe.Created {
			err = fmt.Errorf("outcome %s, want created", res.Outcome)
		}
		done <- err
	}()
	<-stalled
	run, err := c.GetRun(ctx, "st-1")
	require.NoError(t, err)
	require.Equal(t, StatusRunning, run.Status)
	require.Zero(t, runTasks(t, c, "stalled", "st-1"), "the run has no task")

	// The sweeper wakes it: a runs once, and the run parks on its event.
	awaitParked(t, c, "st-1", "st-1.event=go.0")
	require.Equal(t, 1, effects.get("st-1.a.0"))
	require.Equal(t, 1, replays.get("st-1"))

	// The stalled start publishes its task now: dropped unreplayed.
	close(resume)
	require.NoError(t, <-done)
	waitTasksDrained(t, c)
	require.Equal(t, 1, replays.get("st-1"), "the late start task replayed the body")

	res, err := c.SendEvent(ctx, "st-1", "go", "go-1", json.RawMessage(`"go"`))
	require.NoError(t, err)
	require.Equal(t, EventDelivered, res.Outcome)
	out, err := c.WaitRun(ctx, "st-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, out.Status)
	require.Equal(t, map[string]int{"st-1.a.0": 1, "st-1.b.0": 1}, effects.snapshot())
}

// G25: a start task a producer of the previous version published for a
// duplicate start (it published before it read the record), stored while
// the run is parked, is acknowledged without a replay: the body is not
// replayed and the lease not written.
func TestEarlierProducersDuplicateStartTaskIsNotReplayed(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{DuplicateWindow: 100 * time.Millisecond})
	replays := replayCounter{newCounter()}
	wf := NewWorkflow("earlier", func(ctx *Context, _ int) (int, error) {
		replays.replayed(ctx)
		_, err := WaitEvent[string](ctx, "go")
		return 1, err
	}, WithEvent[string]("go"))
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 60*time.Second)
	_, err := Start(ctx, c, wf, 0, WithRunID("ea-1"))
	require.NoError(t, err)
	rev := awaitParked(t, c, "ea-1", "ea-1.event=go.0")

	publishEarlierStart(t, c, "earlier", "ea-1", json.RawMessage(`0`))
	waitTasksDrained(t, c)
	require.Equal(t, 1, replays.get("ea-1"), "the duplicate's start task replayed the body")
	require.Equal(t, rev, leaseRev(t, c, "ea-1"))

	_, err = c.SendEvent(ctx, "ea-1", "go", "go-1", json.RawMessage(`"go"`))
	require.NoError(t, err)
	out, err := c.WaitRun(ctx, "ea-1")
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, out.Status)
	require.Equal(t, 2, replays.get("ea-1"))
}

// A start whose task's message ID the broker's window holds for a task of
// another subject — an earlier engine's start task, which carries the run
// ID as its message ID on jetflow.task.> — publishes its task again under
// another message ID: the run has its task and runs.
func TestStartTaskIDHeldByAnEarlierEnginesTask(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	effects := newCounter()
	wf := threeSteps("shadowed", effects)
	env.worker(WorkerConfig{}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	ack, err := c.assets.JS.Publish(ctx, "jetflow.task.shadowed.sh-1", []byte(`{}`), natsjs.WithMsgID("sh-1"))
	require.NoError(t, err)
	require.False(t, ack.Duplicate)

	h, err := Start(ctx, c, wf, 1, WithRunID("sh-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h.Outcome)
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, out)
	require.Equal(t, map[string]int{"sh-1.a.0": 1, "sh-1.b.0": 1, "sh-1.c.0": 1}, effects.snapshot())
	m, err := c.assets.Tasks.GetMsg(ctx, ack.Sequence)
	require.NoError(t, err)
	require.Equal(t, "jetflow.task.shadowed.sh-1", m.Subject, "the earlier engine's task is left to its workers")
}
