package sweep_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/runindex"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/sweep"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) {
	testenv.VerifyNoLeaks(m)
}

const (
	ackWait    = 100 * time.Millisecond
	stuckAfter = time.Second
	interval   = 100 * time.Millisecond
)

// bundle is one test's server, assets and clock.
type bundle struct {
	t      *testing.T
	assets *jetstream.Assets
	reg    *prometheus.Registry
	m      *metrics.Metrics
	t0     time.Time
	now    time.Time
}

func setup(t *testing.T) *bundle {
	t.Helper()
	nc := testenv.Conn(t, testenv.Server(t))
	a, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	return &bundle{t: t, assets: a, reg: reg, m: m, t0: t0, now: t0}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// sweeper returns a sweeper of workflows "w" (on the bundle's clock) whose
// AwaitsEvent hook says run "waiter" waits for an event.
func (b *bundle) sweeper() *sweep.Sweeper {
	b.t.Helper()
	s, err := sweep.New(sweep.Config{
		Assets: b.assets, Workflows: []string{"w"}, AckWait: ackWait, Interval: interval,
		StuckAfter: stuckAfter, Logger: testenv.Logger(b.t), Metrics: b.m,
		Now: func() time.Time { return b.now },
		AwaitsEvent: func(_ context.Context, r sweep.Run) (bool, error) {
			return r.RunID == "waiter", nil
		},
	})
	require.NoError(b.t, err)
	return s
}

// run writes a run record created at created.
func (b *bundle) run(id, wf string, gen int, status state.Status, created time.Time) uint64 {
	b.t.Helper()
	rec, err := state.Encode(state.Run{
		V: state.Version, RunID: id, Workflow: wf, Input: json.RawMessage(`{"n":1}`), Status: status,
		Token: "token-" + id, Generation: gen, CreatedAt: created, UpdatedAt: created, Exec: state.ExecLease,
	})
	require.NoError(b.t, err)
	rev, err := b.assets.Runs.Create(ctx(b.t), id, rec)
	require.NoError(b.t, err)
	return rev
}

// schedule stores a timer due in an hour.
func schedule(t *testing.T, b *bundle, tm jetstream.Timer) error {
	t.Helper()
	due := time.Now().Add(time.Hour)
	return jetstream.ScheduleTimer(ctx(t), b.assets.JS, tm, "t1", []byte(`{}`), due, due)
}

// task stores a message on a task subject.
func (b *bundle) task(subject string) {
	b.t.Helper()
	d, err := jetstream.PublishTask(ctx(b.t), b.assets.JS, subject, subject, []byte(`{}`))
	require.NoError(b.t, err)
	require.Equal(b.t, jetstream.Stored, d)
}

// TestPassFindsOnlyRunsWithNothingPending builds every case of a running
// run by hand — a run task, a branch task of a later generation, a timer, an
// awaited event, a run ID that prefixes another's, a young run, a finished
// run, a run of a workflow not served — and checks that only the runs with
// nothing pending are dispatched again, on the second pass that finds them
// so, with a wake that resumes them, once.
func TestPassFindsOnlyRunsWithNothingPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.t0.Add(-time.Hour)

	stuckRev := b.run("stuck", "w", 0, state.StatusRunning, old)
	againRev := b.run("again", "w", 3, state.StatusRunning, old)
	b.task("jetflow.branch.w.again.a.0") // a leftover of generation 0: not generation 3's
	b.run("pre", "w", 0, state.StatusRunning, old)
	b.run("pre-fix", "w", 0, state.StatusRunning, old)
	b.task("jetflow.run.w.pre-fix") // pre-fix's run task, not pre's
	b.run("started", "w", 0, state.StatusRunning, old)
	b.task("jetflow.run.w.started")
	b.run("stepping", "w", 2, state.StatusRunning, old)
	b.task("jetflow.branch.w.stepping/2.b.1")
	b.run("sleeping", "w", 0, state.StatusRunning, old)
	err := schedule(t, b, jetstream.RunTimer("w", "sleeping.b.0"))
	require.NoError(t, err)
	b.run("due", "w", 0, state.StatusRunning, old)
	_, err = b.assets.JS.Publish(ctx(t), "jetflow.fire.run.w.due.nap.0", []byte(`{}`)) // fired, not yet moved
	require.NoError(t, err)
	b.run("waiter", "w", 0, state.StatusRunning, old)
	b.run("young", "w", 0, state.StatusRunning, b.t0.Add(-stuckAfter/2))
	b.run("done", "w", 0, state.StatusCompleted, old)
	b.run("other", "x", 0, state.StatusRunning, old)

	s := b.sweeper()
	healthy := []string{"pre-fix", "started", "stepping", "sleeping", "due", "waiter"}
	stuck := []string{"stuck", "again", "pre"}

	p := s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 12, p.Read)
	require.Equal(t, 10, p.Tracked, "running runs of served workflows")
	require.ElementsMatch(t, slices.Concat(healthy, stuck), p.Checked, "young is not due yet")
	require.ElementsMatch(t, stuck, p.Suspected)
	require.Empty(t, p.Redispatched, "one look is not enough")

	b.now = b.now.Add(interval)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 0, p.Read, "nothing written since the last pass")
	require.ElementsMatch(t, stuck, p.Checked, "healthy runs wait StuckAfter before the next look")
	require.ElementsMatch(t, stuck, p.Redispatched)
	require.Equal(t, 3.0, countStuck(t, b.reg, "w"))

	// Each stuck run is woken, on its generation's run subject, with a
	// message ID of the sweep decision.
	for id, want := range map[string]struct {
		identity string
		gen      int
		rev      uint64
	}{
		"stuck": {"stuck", 0, stuckRev},
		"again": {"again/3", 3, againRev},
	} {
		m, err := b.assets.Tasks.GetLastMsgForSubject(ctx(t), "jetflow.run.w."+want.identity)
		require.NoError(t, err, id)
		task, err := state.DecodeTask(m.Data)
		require.NoError(t, err)
		require.Equal(t, id, task.RunID)
		require.Equal(t, "w", task.Workflow)
		require.True(t, task.Wake, "a wake")
		require.Empty(t, task.StepID, "about no step")
		require.Equal(t, "token-"+id, task.Token)
		require.Equal(t, want.gen, task.Generation)
		require.JSONEq(t, `{"n":1}`, string(task.Input))
		require.Regexp(t, `^`+want.identity+`\.sweep\.`+strconv.FormatUint(want.rev, 10)+`\.\d+$`, m.Header.Get("Nats-Msg-Id"))
	}

	b.now = b.now.Add(interval)
	p = s.Pass(ctx(t))
	require.Empty(t, p.Checked, "nothing is due")

	// A StuckAfter later every run is looked at again: the stuck ones have
	// their wake now; young is due.
	b.now = b.now.Add(stuckAfter)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.ElementsMatch(t, append(slices.Concat(healthy, stuck), "young"), p.Checked)
	require.ElementsMatch(t, []string{"young"}, p.Suspected)

	// A record written since is read, and only it: a finished run is
	// forgotten. Young, found with nothing pending twice, is dispatched.
	v, rev, err := b.assets.Runs.Get(ctx(t), "started")
	require.NoError(t, err)
	run, err := state.DecodeRun(v)
	require.NoError(t, err)
	run.Status = state.StatusCompleted
	enc, err := state.Encode(run)
	require.NoError(t, err)
	_, err = b.assets.Runs.Update(ctx(t), "started", enc, rev)
	require.NoError(t, err)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 1, p.Read)
	require.Equal(t, 9, p.Tracked)
	require.Equal(t, []string{"young"}, p.Redispatched)
	require.Equal(t, 4.0, countStuck(t, b.reg, "w"))
}

// TestConcurrentSweepersDispatchOnce: two sweepers (two workers) deciding
// about the same stuck run in the same epoch publish one wake, even
// when the first one was consumed before the second sweeper published.
func TestConcurrentSweepersDispatchOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.run("stuck", "w", 0, state.StatusRunning, b.t0.Add(-time.Hour))
	s1, s2 := b.sweeper(), b.sweeper()
	for _, s := range []*sweep.Sweeper{s1, s2} {
		p := s.Pass(ctx(t))
		require.NoError(t, p.Err)
		require.Equal(t, []string{"stuck"}, p.Suspected)
	}
	b.now = b.now.Add(interval)
	p := s1.Pass(ctx(t))
	require.Equal(t, []string{"stuck"}, p.Redispatched)
	// A worker takes the task and acknowledges it (here: removes it).
	m, err := b.assets.Tasks.GetLastMsgForSubject(ctx(t), "jetflow.run.w.stuck")
	require.NoError(t, err)
	require.NoError(t, b.assets.Tasks.DeleteMsg(ctx(t), m.Sequence))

	p = s2.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Empty(t, p.Redispatched)
	require.Equal(t, []string{"stuck"}, p.Absorbed, "the broker's message ID window absorbed the same decision")
	require.Equal(t, 1.0, countStuck(t, b.reg, "w"))
}

// TestRecordChangedBeforeDispatchIsLeftAlone: a run that finishes between
// the check and the dispatch (its last task acknowledged after its record
// was set completed) is not dispatched again.
func TestRecordChangedBeforeDispatchIsLeftAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rev := b.run("finishing", "w", 0, state.StatusRunning, b.t0.Add(-time.Hour))
	s := b.sweeper()
	require.Equal(t, []string{"finishing"}, s.Pass(ctx(t)).Suspected)
	v, _, err := b.assets.Runs.Get(ctx(t), "finishing")
	require.NoError(t, err)
	run, err := state.DecodeRun(v)
	require.NoError(t, err)
	run.Status = state.StatusCompleted
	enc, err := state.Encode(run)
	require.NoError(t, err)
	_, err = b.assets.Runs.Update(ctx(t), "finishing", enc, rev)
	require.NoError(t, err)

	// The next pass reads the new revision first and forgets the run.
	b.now = b.now.Add(interval)
	p := s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Empty(t, p.Redispatched)
	require.Equal(t, 0, p.Tracked)
	_, err = b.assets.Tasks.GetLastMsgForSubject(ctx(t), "jetflow.run.w.finishing")
	require.ErrorIs(t, err, natsjs.ErrMsgNotFound)
	require.Equal(t, 0.0, countStuck(t, b.reg, "w"))
}

// TestRecreatedBucketIsReadAgain: a sweeper that has read a runs bucket
// up to some revision reads every record again when the bucket is
// recreated (or restored) with fewer: resuming after the old revision
// would miss them.
func TestRecreatedBucketIsReadAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.t0.Add(-time.Hour)
	for _, id := range []string{"r1", "r2", "r3"} {
		b.run(id, "w", 0, state.StatusCompleted, old)
	}
	s := b.sweeper()
	p := s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 3, p.Read)

	require.NoError(t, b.assets.JS.DeleteStream(ctx(t), "KV_"+jetstream.RunsBucket))
	_, err := jetstream.Provision(ctx(t), b.assets.JS.Conn(), jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	b.run("stuck", "w", 0, state.StatusRunning, old) // revision 1 of the new bucket

	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 1, p.Read)
	require.Equal(t, []string{"stuck"}, p.Suspected)
}

// TestTimersStreamIsOptional: a timer keeps a run healthy while
// JETFLOW_TIMERS holds it; once the stream is gone, the run has no timer
// (not an error that would keep it from ever being dispatched).
func TestTimersStreamIsOptional(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Provisioning created JETFLOW_TIMERS; a retry timer waits in it.
	err := schedule(t, b, jetstream.RunTimer("w", "sleeping.a.0"))
	require.NoError(t, err)
	b.run("sleeping", "w", 0, state.StatusRunning, b.t0.Add(-time.Hour))
	s := b.sweeper()
	p := s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, []string{"sleeping"}, p.Checked)
	require.Empty(t, p.Suspected)

	require.NoError(t, b.assets.JS.DeleteStream(ctx(t), sweep.TimersStream))
	b.now = b.now.Add(stuckAfter)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, []string{"sleeping"}, p.Suspected)
	b.now = b.now.Add(interval)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, []string{"sleeping"}, p.Redispatched)
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := sweep.Config{AckWait: 30 * time.Second}.WithDefaults()
	require.Equal(t, sweep.DefaultInterval, c.Interval)
	require.Equal(t, sweep.DefaultStuckAfter, c.StuckAfter)
	require.NoError(t, c.Validate())

	c = sweep.Config{AckWait: 10 * time.Minute}.WithDefaults()
	require.Equal(t, 30*time.Minute, c.StuckAfter, "the default follows a long AckWait")

	for name, bad := range map[string]sweep.Config{
		"StuckAfter": {AckWait: time.Second, Interval: time.Second, StuckAfter: 2 * time.Second},
		"Interval":   {AckWait: time.Second, Interval: time.Millisecond, StuckAfter: time.Minute},
		"AckWait":    {Interval: time.Second, StuckAfter: time.Minute},
	} {
		require.ErrorContains(t, bad.Validate(), name)
	}
	_, err := sweep.New(sweep.Config{AckWait: time.Second})
	require.ErrorContains(t, err, "Assets")
}

func countStuck(t *testing.T, reg *prometheus.Registry, wf string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != metrics.NameRunsStuck {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "workflow" && l.GetValue() == wf {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestTimerHeldRunsAreCheckedLessOften: a run held by a timer (asleep, or
// waiting for an event) is checked StuckAfter after each check at first,
// then twice as long after each check that finds it held by a timer; a
// check that finds a task instead goes back to StuckAfter.
func TestTimerHeldRunsAreCheckedLessOften(t *testing.T) {
	t.Parallel()
	b := setup(t)
	err := schedule(t, b, jetstream.RunTimer("w", "sleeper.nap.0"))
	require.NoError(t, err)
	b.run("sleeper", "w", 0, state.StatusRunning, b.t0.Add(-time.Hour))
	s := b.sweeper()
	checkedAt := func(after time.Duration) bool {
		b.now = b.now.Add(after)
		p := s.Pass(ctx(t))
		require.NoError(t, p.Err)
		require.Empty(t, p.Suspected)
		return slices.Contains(p.Checked, "sleeper")
	}
	require.True(t, checkedAt(0))
	// Checks 1, 2, 3 and 4 found the timer: the next waits 1, 2, 4, 8 × StuckAfter.
	for _, wait := range []int{1, 2, 4, 8} {
		require.False(t, checkedAt(time.Duration(wait)*stuckAfter-interval), "checked before %d × StuckAfter", wait)
		require.True(t, checkedAt(interval), "not checked at %d × StuckAfter", wait)
	}
	// The timer fired: a task holds the run now, and checks come every
	// StuckAfter again (after the one already due).
	require.NoError(t, b.assets.Timers.Purge(ctx(t)))
	b.task("jetflow.branch.w.sleeper.after.0")
	require.True(t, checkedAt(16*stuckAfter))
	require.False(t, checkedAt(stuckAfter-interval))
	require.True(t, checkedAt(interval))
}

// TestPassIndexesRunsMissingFromTheIndex: a running run whose record was
// written without its run index entry (its writer died in between) is
// listed again after the sweeper's first check of it; a run the index
// lists is left as it is, and a run is looked up in the index once. A
// pass rebuilds an index purged or deleted by hand.
func TestPassIndexesRunsMissingFromTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.t0.Add(-time.Hour)
	store := runs.New(b.assets)
	_, err := store.EnsureIndex(ctx(t)) // built (empty), as a worker's start leaves it
	require.NoError(t, err)
	b.run("unlisted", "w", 0, state.StatusRunning, old) // a record alone, as a writer that died leaves it
	b.task("jetflow.run.w.unlisted")
	listed := state.Run{V: state.Version, RunID: "listed", Workflow: "w", Status: state.StatusRunning, Token: "token-listed", CreatedAt: old, UpdatedAt: old, Exec: state.ExecLease}
	_, err = store.Create(ctx(t), listed) // record and entry
	require.NoError(t, err)
	b.task("jetflow.run.w.listed")
	entries := func() []string {
		page, err := store.Index().Page(ctx(t), runindex.Query{Limit: 10})
		require.NoError(t, err)
		var ids []string
		for _, e := range page.Entries {
			ids = append(ids, e.RunID)
		}
		return ids
	}
	require.Equal(t, []string{"listed"}, entries())

	s := b.sweeper()
	p := s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.ElementsMatch(t, []string{"unlisted", "listed"}, p.Checked)
	require.Equal(t, []string{"unlisted"}, p.Indexed)
	require.ElementsMatch(t, []string{"unlisted", "listed"}, entries())

	b.now = b.now.Add(2 * stuckAfter)
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.ElementsMatch(t, []string{"unlisted", "listed"}, p.Checked)
	require.Empty(t, p.Indexed)
	require.False(t, p.IndexRebuilt)

	// The index purged by hand (its build marker with it): the next pass
	// rebuilds it; deleted, the same.
	require.NoError(t, b.assets.Index.Purge(ctx(t)))
	require.Empty(t, entries())
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.True(t, p.IndexRebuilt)
	require.ElementsMatch(t, []string{"unlisted", "listed"}, entries())
	require.NoError(t, b.assets.JS.DeleteStream(ctx(t), jetstream.IndexStream))
	p = s.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.True(t, p.IndexRebuilt)
	require.ElementsMatch(t, []string{"unlisted", "listed"}, entries())
}

// expiries are the identities of the runs in the expiries stored in
// JETFLOW_TIMERS, and whether each is due within the hour (sorted).
func (b *bundle) expiries() []string {
	b.t.Helper()
	info, err := b.assets.Timers.Info(ctx(b.t), natsjs.WithSubjectFilter("jetflow.sched.expire.>"))
	require.NoError(b.t, err)
	var out []string
	for subject := range info.State.Subjects {
		m, err := b.assets.Timers.GetLastMsgForSubject(ctx(b.t), subject)
		require.NoError(b.t, err)
		e, err := state.DecodeExpiry(m.Data)
		require.NoError(b.t, err)
		for _, r := range e.Runs {
			out = append(out, r.Identity())
		}
	}
	slices.Sort(out)
	return out
}

// TestEndsAreScheduledOnceAcrossSweepers: the sweepers of several workers
// read every run record, and the ends among them — a record written
// ended, of any workflow, and the generations a new one replaced — get
// their expiry stored once: by the first sweeper to read them, which
// moves the shared cursor past them. A sweeper that starts later reads
// every record again and schedules nothing the cursor has passed. An
// expiry that cannot be stored is kept, the cursor stays below it, and
// the next pass stores it. Before the deployment has a cursor, an expiry
// marker is an end too.
func TestEndsAreScheduledOnceAcrossSweepers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.t0.Add(-time.Hour)
	b.run("done-1", "w", 0, state.StatusCompleted, old)
	b.run("done-2", "other", 0, state.StatusFailed, old)
	b.run("running", "w", 0, state.StatusRunning, old)
	rec, err := state.Encode(state.Run{
		V: state.Version, RunID: "again", Workflow: "w", Status: state.StatusRunning, Token: "t2", Generation: 2,
		CreatedAt: old, UpdatedAt: old, Exec: state.ExecLease,
		Predecessors: []state.Predecessor{
			{Generation: 0, Token: "t0", Status: state.StatusCompleted},
			{Generation: 1, Token: "t1", Status: state.StatusCancelled, Ended: old},
		},
	})
	require.NoError(t, err)
	_, err = b.assets.Runs.Create(ctx(t), "again", rec)
	require.NoError(t, err)
	// A run whose record expired under the version before (a marker):
	// its records are due at once, on the deployment's first pass.
	b.run("gone", "w", 0, state.StatusCompleted, old)
	require.NoError(t, b.assets.Runs.Raw().Delete(ctx(t), "gone"))

	s1, s2 := b.sweeper(), b.sweeper()
	p := s1.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 5, p.Expiring)
	require.Equal(t, []string{"again", "again/1", "done-1", "done-2", "gone"}, b.expiries())
	p = s2.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Zero(t, p.Expiring, "the cursor had passed every end")

	b.run("done-3", "w", 0, state.StatusCancelled, old)
	b.run("gone-2", "w", 0, state.StatusCompleted, old)
	p = s2.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 2, p.Expiring)
	// Once there is a cursor, a marker's end was read before it.
	require.NoError(t, b.assets.Runs.Raw().Delete(ctx(t), "gone-2"))
	p = s1.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Zero(t, p.Expiring)
	p = b.sweeper().Pass(ctx(t)) // a worker that starts now
	require.NoError(t, p.Err)
	require.Zero(t, p.Expiring)
	require.Len(t, b.expiries(), 7) // gone-2's record, ended, too

	// The timers stream is gone for a while (deleted by hand): the expiry
	// waits in the sweeper that read the end, and the cursor for it.
	require.NoError(t, b.assets.JS.DeleteStream(ctx(t), jetstream.TimersStream))
	b.run("done-4", "w", 0, state.StatusCompleted, old)
	p = s1.Pass(ctx(t))
	require.Error(t, p.Err)
	require.Zero(t, p.Expiring)
	_, err = jetstream.Provision(ctx(t), b.assets.JS.Conn(), jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	p = s1.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Equal(t, 1, p.Expiring)
	require.Equal(t, []string{"done-4"}, b.expiries())
	p = s2.Pass(ctx(t))
	require.NoError(t, p.Err)
	require.Zero(t, p.Expiring)
}
