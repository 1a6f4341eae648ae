package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// The tests in this file run the engine on a three-node JetStream cluster
// (internal/testsupport/testenv.Cluster) with every stream and bucket at three replicas,
// and fault the cluster while runs are started and executed (G1, G6, G8).

// r3AckWait is the workers' AckWait: short, so that tasks whose ack was lost
// in a leader change are redelivered quickly.
const r3AckWait = time.Second

// r3Env is one test's cluster and the engine's topology on it.
type r3Env struct {
	t    *testing.T
	cl   *testenv.Cluster
	topo Topology
	logs *r3LogCounter
	// workers counts the workers started, to name them.
	workers int
}

// r3Slots bounds how many three-node clusters this package runs at once: each
// is CPU-heavy, and the package's other tests run alongside (t.Parallel).
var r3Slots = make(chan struct{}, 2)

func newR3Env(t *testing.T) *r3Env {
	t.Helper()
	select {
	case r3Slots <- struct{}{}:
	case <-time.After(5 * time.Minute):
		t.Fatal("no cluster slot in 5 minutes")
	}
	t.Cleanup(func() { <-r3Slots }) // after the cluster's own cleanup
	return &r3Env{t: t, cl: testenv.NewCluster(t), topo: Topology{Replicas: 3}, logs: &r3LogCounter{n: map[string]int{}}}
}

// client returns a client whose connection starts on node prefer (-1: any)
// and fails over to the others.
func (e *r3Env) client(prefer int) *Client {
	e.t.Helper()
	c, err := NewClient(ctxT(e.t, 30*time.Second), e.cl.Conn(e.t, prefer), ClientConfig{Topology: e.topo})
	require.NoError(e.t, err)
	return c
}

// worker starts a worker connected to node prefer first, stopped when the
// test ends. Its warnings go to the test log and are counted by message.
func (e *r3Env) worker(prefer int, name string, wfs ...Registrable) *Worker {
	e.t.Helper()
	w := startWorker(e.t, e.cl.Conn(e.t, prefer), WorkerConfig{
		Name: name, AckWait: r3AckWait, Topology: e.topo,
		Logger: testenv.Logger(e.t).Hook(e.logs),
	}, wfs...)
	stopAtEnd(e.t, w, 20*time.Second)
	return w
}

// r3Worker starts a worker on node prefer serving the workflow name, whose
// steps record their runs in fx as this worker's.
func (e *r3Env) r3Worker(prefer int, name string, fx *r3Effects) *Worker {
	e.t.Helper()
	e.workers++
	id := fmt.Sprintf("w%d-node%d", e.workers, prefer)
	return e.worker(prefer, id, r3Workflow(name, fx.recorder(id)))
}

// r3LogCounter counts the workers' warnings by message: how often each
// degraded path (release, failed settle, ...) was taken.
type r3LogCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *r3LogCounter) Run(_ *zerolog.Event, level zerolog.Level, msg string) {
	if level < zerolog.WarnLevel {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n[msg]++
}

func (h *r3LogCounter) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(h.n)
}

// The engine provisioned at three replicas runs end to end: runs started
// through a client on one node are executed by workers on the two others,
// every duplicate start is absorbed, every step runs once.
func TestClusterEndToEnd(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	env := newR3Env(t)
	fx := env.effects()
	wf := r3Workflow("r3e2e", fx.recorder("client"))
	c := env.client(0)
	env.r3Worker(1, "r3e2e", fx)
	env.r3Worker(2, "r3e2e", fx)

	info, err := c.assets.Tasks.Info(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	require.Len(t, info.Cluster.Replicas, 2, "the task stream has two followers")
	for _, b := range []*jetstream.KV{c.assets.Runs, c.assets.Steps, c.assets.Audit} {
		st, err := b.Raw().Status(ctxT(t, 10*time.Second))
		require.NoError(t, err)
		require.Equal(t, 3, st.(*natsjs.KeyValueBucketStatus).StreamInfo().Config.Replicas, b.Bucket())
	}

	runs := 200
	if testing.Short() {
		runs = 40
	}
	plan := r3Plan("e2e", runs, 100) // every run ID started twice
	mon := r3WatchRuns(t, c)
	l := newR3Ledger()
	r3Produce(c, wf, plan, 8, 2*time.Millisecond, l)

	// One start by name, through a worker's start service.
	res, err := c.StartByName(ctxT(t, 10*time.Second), "r3e2e", json.RawMessage(`0`), WithRunID("e2e-byname"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, res.Outcome)
	plan = append(plan, r3Start{id: "e2e-byname"})
	l.created["e2e-byname"]++
	l.accepted++

	sum := r3Check(t, c, plan, l, mon, fx, 30*time.Second)
	t.Logf("%s; duration %s", sum, time.Since(begin).Round(time.Millisecond))
	sum.logDetails(t)
	t.Logf("start errors by cause: %v; worker warnings: %s", l.errorCauses(), env.logs)
	require.Zero(t, sum.Errors, "no start fails on a healthy cluster")
	require.Equal(t, runs+1, sum.Created)
	require.Equal(t, runs, sum.Existing)
	sum.require(t)
	waitTasksDrained(t, c)
}

// G1, G6, G8: the task stream's leader node is stopped while runs are
// started at a steady rate (30% of the run IDs started twice), and restarted.
func TestClusterTaskStreamLeaderLoss(t *testing.T) {
	t.Parallel()
	r3Failover(t, jetstream.TasksStream)
}

// G1, G6, G8: the same with the runs bucket's leader node, the admission
// authority.
func TestClusterRunsBucketLeaderLoss(t *testing.T) {
	t.Parallel()
	r3Failover(t, "KV_"+jetstream.RunsBucket)
}

// r3Failover puts the leadership of stream (and, for the task stream, of its
// consumers) on one node and every other leadership elsewhere, starts a
// steady load of starts through a client connected to that node, stops the
// node once a third of the starts are accepted, restarts it once two thirds
// are, and checks what the engine promised.
func r3Failover(t *testing.T, stream string) {
	begin := time.Now()
	env := newR3Env(t)
	fx := env.effects()
	wfName := "r3fo"
	wf := r3Workflow(wfName, fx.recorder("client"))
	const victim = 0
	c := env.client(victim)          // the producer's connection is on the node that goes away
	env.r3Worker(victim, wfName, fx) // one worker is too; the other is not
	env.r3Worker(1, wfName, fx)

	// Place the leaderships: the faulted stream on the victim, every other
	// stream away from it; the task consumers follow the task stream.
	admin := env.cl.Conn(t, 2)
	others := []string{jetstream.TasksStream, "KV_" + jetstream.RunsBucket, "KV_" + jetstream.StepsBucket, "KV_" + jetstream.AuditBucket}
	for n, s := range others {
		if s == stream {
			env.cl.MoveLeader(admin, s, victim)
			continue
		}
		env.cl.MoveLeader(admin, s, 1+n%2)
	}
	for _, kind := range []jetstream.TaskKind{jetstream.RunTasks, jetstream.BranchTasks} {
		to := 2
		if stream == jetstream.TasksStream {
			to = victim
		}
		env.cl.MoveConsumerLeader(admin, jetstream.TasksStream, jetstream.ConsumerName(wfName, kind), to)
	}
	env.cl.WaitReady()
	setupAt := time.Since(begin)

	runs := 400
	if testing.Short() {
		runs = 100
	}
	plan := r3Plan("fo", runs, 30)
	mon := r3WatchRuns(t, c)
	l := newR3Ledger()
	total := len(plan)

	// The load: one start every 8ms from 8 producers, each retrying a start
	// that returned an error as a real producer would.
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		r3Produce(c, wf, plan, 8, 8*time.Millisecond, l)
	}()

	// The fault, on events: a third accepted, stop; two thirds, restart.
	l.waitAccepted(t, total/3, 60*time.Second)
	stopAt := time.Since(begin)
	env.cl.Stop(victim)
	newLeader := env.cl.StreamLeader(stream)
	l.waitAccepted(t, 2*total/3, 60*time.Second)
	restartAt := time.Since(begin)
	env.cl.Restart(victim)
	readyAt := time.Since(begin)
	// A worker process comes back with the node: its reads are served by
	// the replicas that just caught up.
	env.r3Worker(victim, wfName, fx)
	l.waitLoad(t, loadDone, total, 90*time.Second)
	loadAt := time.Since(begin)

	sum := r3Check(t, c, plan, l, mon, fx, 60*time.Second)
	t.Logf("%s: set up at %s, stop at %s (new leader %s), restart at %s (ready at %s), load done at %s, checked at %s",
		stream, setupAt.Round(time.Millisecond), stopAt.Round(time.Millisecond), env.cl.Name(newLeader), restartAt.Round(time.Millisecond),
		readyAt.Round(time.Millisecond), loadAt.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	t.Logf("%s: %s", stream, sum)
	sum.logDetails(t)
	t.Logf("%s: start errors by cause: %v; worker warnings: %s", stream, l.errorCauses(), env.logs)
	sum.require(t)
	waitTasksDrained(t, c)
}

// r3Start is one planned start.
type r3Start struct {
	id  string
	dup bool // a repeat of a run ID started before (or just now)
}

// r3Plan starts runs distinct run IDs in order; after dupPercent percent of
// them a duplicate start of a recent run ID (possibly the same one, racing
// it on another producer) follows.
func r3Plan(prefix string, runs, dupPercent int) []r3Start {
	rng := rand.New(rand.NewPCG(uint64(runs), uint64(dupPercent)))
	var plan []r3Start
	for i := range runs {
		plan = append(plan, r3Start{id: fmt.Sprintf("%s-%d", prefix, i)})
		if rng.IntN(100) < dupPercent {
			back := rng.IntN(min(i, 20) + 1)
			plan = append(plan, r3Start{id: fmt.Sprintf("%s-%d", prefix, i-back), dup: true})
		}
	}
	return plan
}

// r3Ledger is the producers' record: every start and what it was told.
type r3Ledger struct {
	mu        sync.Mutex
	created   map[string]int
	existing  map[string]int
	errored   map[string]int // failed attempts per run ID
	causes    map[string]int // failed attempts by innermost cause
	accepted  int
	retried   int // starts accepted after at least one failed attempt
	lost      []string
	badHandle []string
	progress  chan struct{}
}

func newR3Ledger() *r3Ledger {
	return &r3Ledger{
		created: map[string]int{}, existing: map[string]int{}, errored: map[string]int{},
		causes: map[string]int{}, progress: make(chan struct{}, 1),
	}
}

func (l *r3Ledger) failed(id string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errored[id]++
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	l.causes[msg]++
}

func (l *r3Ledger) accept(id string, h *Handle[int], attempts int) {
	l.mu.Lock()
	l.accepted++
	if attempts > 1 {
		l.retried++
	}
	if h.Outcome == OutcomeCreated {
		l.created[id]++
	} else {
		l.existing[id]++
	}
	if h.RunID != id || (h.Outcome == OutcomeExisting && h.Duplicates < 1) || (h.Outcome != OutcomeCreated && h.Outcome != OutcomeExisting) {
		l.badHandle = append(l.badHandle, fmt.Sprintf("%s: %+v", id, *h))
	}
	l.mu.Unlock()
	select {
	case l.progress <- struct{}{}:
	default:
	}
}

func (l *r3Ledger) acceptedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted
}

func (l *r3Ledger) errorCauses() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.causes)
}

// waitAccepted waits until n starts are accepted, for as long as starts
// keep being accepted: it fails when none was for stall. A busy machine
// makes the load slower, not stalled, so the allowance is for a stall,
// not for the whole load.
func (l *r3Ledger) waitAccepted(t *testing.T, n int, stall time.Duration) {
	t.Helper()
	if !l.progressUntil(func() bool { return l.acceptedCount() >= n }, nil, stall) {
		t.Fatalf("only %d of %d starts accepted, none in the last %s", l.acceptedCount(), n, stall)
	}
}

// waitLoad waits until done is closed (the producers finished), for as
// long as starts keep being accepted; it fails when none was for stall.
func (l *r3Ledger) waitLoad(t *testing.T, done <-chan struct{}, total int, stall time.Duration) {
	t.Helper()
	if !l.progressUntil(func() bool { return false }, done, stall) {
		t.Fatalf("the load did not finish: %d of %d starts accepted, none in the last %s", l.acceptedCount(), total, stall)
	}
}

// progressUntil waits until cond holds or done is closed, and reports
// false when no start was accepted for stall before that.
func (l *r3Ledger) progressUntil(cond func() bool, done <-chan struct{}, stall time.Duration) bool {
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for !cond() {
		select {
		case <-l.progress:
			timer.Reset(stall)
		case <-done:
			return true
		case <-timer.C:
			return false
		}
	}
	return true
}

// r3Produce feeds plan to producers goroutines, one start every every. A
// start that fails is retried (same run ID) every 100ms for up to 60s.
func r3Produce(c *Client, wf *Workflow[int, int], plan []r3Start, producers int, every time.Duration, l *r3Ledger) {
	work := make(chan r3Start)
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				giveUp := time.Now().Add(60 * time.Second)
				for attempt := 1; ; attempt++ {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					h, err := Start(ctx, c, wf, 0, WithRunID(s.id), WithSource(fmt.Sprintf("attempt-%d", attempt)))
					cancel()
					if err == nil {
						l.accept(s.id, h, attempt)
						break
					}
					l.failed(s.id, err)
					if time.Now().After(giveUp) {
						l.mu.Lock()
						l.lost = append(l.lost, s.id)
						l.mu.Unlock()
						break
					}
					time.Sleep(100 * time.Millisecond) // the producer's retry backoff
				}
			}
		}()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for _, s := range plan {
		<-tick.C
		work <- s
	}
	close(work)
	wg.Wait()
}

// r3RunsMonitor watches the runs bucket from before the first start: every
// revision of every run record it sees.
type r3RunsMonitor struct {
	mu      sync.Mutex
	revs    map[string][]state.Run
	changed chan struct{}
}

func r3WatchRuns(t *testing.T, c *Client) *r3RunsMonitor {
	t.Helper()
	m := &r3RunsMonitor{revs: map[string][]state.Run{}, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.assets.Runs.Raw().WatchAll(ctx, natsjs.IgnoreDeletes())
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		_ = w.Stop()
		<-done
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				r, err := state.DecodeRun(e.Value())
				if err != nil {
					r = state.Run{RunID: e.Key(), Status: "undecodable"}
				}
				m.mu.Lock()
				m.revs[e.Key()] = append(m.revs[e.Key()], r)
				m.mu.Unlock()
				select {
				case m.changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	return m
}

// unfinished lists the run IDs of ids whose last seen revision is not
// terminal.
func (m *r3RunsMonitor) unfinished(ids []string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, id := range ids {
		revs := m.revs[id]
		if len(revs) == 0 || !revs[len(revs)-1].Status.Terminal() {
			out = append(out, id)
		}
	}
	return out
}

// r3Summary is what the checker saw.
type r3Summary struct {
	Starts, Duplicates, Unique  int
	Accepted, Retried, Errors   int
	Created, Existing           int
	CreatedByNone               []string // run IDs no accepted start reported as created
	CreatedTwice                []string
	BadHandles                  []string
	Abandoned                   []string // starts the producer gave up on (60s of failed attempts)
	Runs, Completed             int
	Unfinished                  []string // runs not completed within the deadline
	Recreated                   []string // run records written by two different start calls
	CommittedSteps, SideEffects int
	MissingSteps                []string // steps of completed runs without a committed result
	// Doubled lists the committed steps whose side effect ran more than
	// once. Concurrent are those whose every extra run began before the
	// step was committed (a task redelivered while its first attempt was
	// still running: at least once until committed, as G6 allows);
	// AfterCommit are side effects that began when the step was already
	// committed (G6 forbids them).
	Doubled, Concurrent, AfterCommit []string
	Unknown                          int // runs whose probe could not reach the steps bucket's leader
	// StaleReads are executor reads of a committed step (direct gets,
	// answered by the replica of the worker's node) that did not find it
	// though they were sent after the leader had stored it.
	StaleReads []string
	// UnfinishedStale are the unfinished runs one of whose steps had a
	// stale read.
	UnfinishedStale []string
	Orphaned        []string // side effects of steps never committed
	WrongOutput     []string
}

func (s r3Summary) String() string {
	return fmt.Sprintf("starts=%d (unique run IDs %d, duplicate starts %d) accepted=%d failed-attempts=%d retried-starts=%d "+
		"created=%d existing=%d created-by-none=%d created-twice=%d bad-handles=%d abandoned-starts=%d | "+
		"runs=%d completed=%d unfinished=%d recreated=%d | committed-steps=%d side-effects=%d missing-steps=%d "+
		"doubled=%d (concurrent attempts %d, after commit %d, probe unknown %d) orphaned=%d wrong-output=%d | stale step reads %d",
		s.Starts, s.Unique, s.Duplicates, s.Accepted, s.Errors, s.Retried,
		s.Created, s.Existing, len(s.CreatedByNone), len(s.CreatedTwice), len(s.BadHandles), len(s.Abandoned),
		s.Runs, s.Completed, len(s.Unfinished), len(s.Recreated),
		s.CommittedSteps, s.SideEffects, len(s.MissingSteps),
		len(s.Doubled), len(s.Concurrent), len(s.AfterCommit), s.Unknown, len(s.Orphaned), len(s.WrongOutput), len(s.StaleReads))
}

// logDetails logs the first few of every anomaly.
func (s r3Summary) logDetails(t *testing.T) {
	t.Helper()
	for what, l := range map[string][]string{
		"doubled": s.Doubled, "after-commit": s.AfterCommit, "unfinished": s.Unfinished,
		"created-by-none": s.CreatedByNone, "bad-handles": s.BadHandles, "recreated": s.Recreated, "stale-reads": s.StaleReads,
		"unfinished-after-stale-read": s.UnfinishedStale, "concurrent": s.Concurrent,
	} {
		if len(l) > 0 {
			t.Logf("%s (%d): %v", what, len(l), l[:min(len(l), 12)])
		}
	}
}

// r3StaleReadBug names the engine bug that r3Summary.require reports with
// t.Skip instead of failing, as long as it is the only failure: the
// executor decides whether a step is committed with a direct get
// (jetstream.KV.Get), which on a replicated bucket any replica answers, so a
// lagging follower can say "not committed" for a committed step. The step
// then runs again (G6), or, for an earlier step read by a later step's task,
// its task is re-dispatched into the broker's duplicate window, absorbed, and
// the run never advances again (G8).
const r3StaleReadBug = "engine bug: the executor's step read (KV.Get, a direct get) is served by lagging R3 followers"

func (s r3Summary) require(t *testing.T) {
	t.Helper()
	require.Empty(t, s.Abandoned, "starts never accepted in 60s of retries")
	require.Empty(t, s.BadHandles, "handles naming another run or without a duplicate count")
	require.Empty(t, s.CreatedTwice, "run IDs created by two starts")
	require.Empty(t, s.Recreated, "run records rewritten by another start")
	require.Empty(t, s.WrongOutput, "runs with a wrong output")
	require.Empty(t, s.MissingSteps, "completed runs without all their steps committed")
	require.Empty(t, s.Orphaned, "side effects of steps never committed")
	require.Equal(t, s.Unique, s.Runs)
	require.Equal(t, len(s.Doubled), len(s.Concurrent)+len(s.AfterCommit), "doubled steps neither concurrent nor after a stale read: %v", s.Doubled)
	if len(s.Unfinished) > len(s.UnfinishedStale) {
		require.Empty(t, s.Unfinished, "runs not completed within the deadline (not all explained by stale reads)")
	}
	if len(s.Unfinished) == 0 {
		require.Equal(t, 3*s.Unique, s.CommittedSteps)
	}
	if len(s.Unfinished) > 0 || len(s.AfterCommit) > 0 {
		t.Skipf("%s: %d committed steps ran again after a stale read, %d runs stalled after a stale read of one of their steps; see the log",
			r3StaleReadBug, len(s.AfterCommit), len(s.Unfinished))
	}
}

// r3Check waits up to d for every planned run to complete and compares
// everything the cluster holds with what the producers were told.
func r3Check(t *testing.T, c *Client, plan []r3Start, l *r3Ledger, m *r3RunsMonitor, fx *r3Effects, d time.Duration) r3Summary {
	t.Helper()
	var s r3Summary
	seen := map[string]bool{}
	var ids []string
	for _, p := range plan {
		s.Starts++
		if p.dup {
			s.Duplicates++
		}
		if !seen[p.id] {
			seen[p.id] = true
			ids = append(ids, p.id)
		}
	}
	s.Unique = len(ids)

	l.mu.Lock()
	s.Accepted, s.Retried, s.Abandoned, s.BadHandles = l.accepted, l.retried, append([]string(nil), l.lost...), append([]string(nil), l.badHandle...)
	for _, n := range l.errored {
		s.Errors += n
	}
	for _, id := range ids {
		s.Created += l.created[id]
		s.Existing += l.existing[id]
		switch {
		case l.created[id] > 1:
			s.CreatedTwice = append(s.CreatedTwice, id)
		case l.created[id] == 0:
			// Only a run ID one of whose starts failed may have no start
			// told "created": the failed attempt's write won.
			s.CreatedByNone = append(s.CreatedByNone, id)
			if l.errored[id] == 0 {
				s.BadHandles = append(s.BadHandles, id+": no start was told created, and none failed")
			}
		}
	}
	l.mu.Unlock()

	// Every run completes: wait on the monitor's events, then read what is
	// left directly (the monitor may lag behind a watch that failed over).
	deadline := time.After(d)
wait:
	for len(m.unfinished(ids)) > 0 {
		select {
		case <-m.changed:
		case <-deadline:
			break wait
		}
	}

	// Every revision of a run record carries the token of the start call
	// that created it: no second start rewrote a run.
	m.mu.Lock()
	s.Runs = len(m.revs)
	for id, revs := range m.revs {
		for _, r := range revs[1:] {
			if r.Token != revs[0].Token || !r.CreatedAt.Equal(revs[0].CreatedAt) {
				s.Recreated = append(s.Recreated, id)
				break
			}
		}
	}
	m.mu.Unlock()

	// Read every committed step once, from the steps bucket.
	committed := r3CommittedSteps(t, c)
	s.CommittedSteps = len(committed)
	reads := fx.reads(committed)
	staleStep := map[string]bool{}
	for stepID, rs := range reads {
		for _, r := range rs {
			// Sent 5ms or more after the leader stored the step (the tap
			// sees a request a little after it is sent), and not found.
			if !r.found && r.sinceCommit >= 5*time.Millisecond {
				s.StaleReads = append(s.StaleReads, fmt.Sprintf("%s read %s", stepID, r))
				staleStep[stepID] = true
			}
		}
	}
	sort.Strings(s.StaleReads)
	for _, id := range ids {
		run, err := c.GetRun(ctxT(t, 10*time.Second), id)
		if err != nil || run.Status != StatusCompleted {
			s.Unfinished = append(s.Unfinished, fmt.Sprintf("%s: %v %v", id, run.Status, err))
			for _, step := range []string{"a", "b", "c"} {
				if staleStep[state.StepID(id, step, 0)] {
					s.UnfinishedStale = append(s.UnfinishedStale, id)
					break
				}
			}
			t.Logf("unfinished run %s", r3Diagnose(t, c, id, committed, fx))
			continue
		}
		s.Completed++
		if string(run.Output) != "3" {
			s.WrongOutput = append(s.WrongOutput, fmt.Sprintf("%s: %s", id, run.Output))
		}
		for _, step := range []string{"a", "b", "c"} {
			if _, ok := committed[state.StepID(id, step, 0)]; !ok {
				s.MissingSteps = append(s.MissingSteps, state.StepID(id, step, 0))
			}
		}
	}
	for stepID, runs := range fx.snapshot() {
		s.SideEffects += len(runs)
		rec, ok := committed[stepID]
		if !ok {
			s.Orphaned = append(s.Orphaned, stepID)
			continue
		}
		concurrent := true
		for _, r := range runs {
			switch {
			case r.committedBefore == r3Unknown:
				s.Unknown++
			case r.committedBefore == r3Yes && staleStep[stepID]:
				// The step was committed when this run began, and an
				// executor read sent after the commit did not see it.
				s.AfterCommit = append(s.AfterCommit, fmt.Sprintf("%s attempt %d on %s, %s after the commit of attempt %d by %s; reads of it: %v",
					stepID, r.attempt, r.worker, r.sinceCommit.Round(time.Millisecond), rec.Attempt, rec.Worker, reads[stepID]))
				concurrent = false
			}
			// Committed before the run began, but every read of it was sent
			// before the commit: an attempt that passed its check while the
			// other was committing, i.e. a concurrent attempt.
		}
		if len(runs) > 1 {
			s.Doubled = append(s.Doubled, fmt.Sprintf("%s x%d (committed: attempt %d by %s)", stepID, len(runs), rec.Attempt, rec.Worker))
			if concurrent {
				s.Concurrent = append(s.Concurrent, stepID)
			}
		}
	}
	sort.Strings(s.Doubled)
	sort.Strings(s.AfterCommit)
	return s
}

// r3Diagnose describes a run that did not complete: its record, its
// committed steps, the side effects seen and the tasks pending for it.
func r3Diagnose(t *testing.T, c *Client, runID string, committed map[string]r3StepRecord, fx *r3Effects) string {
	t.Helper()
	var b strings.Builder
	v, rev, err := c.assets.Runs.Get(ctxT(t, 10*time.Second), runID)
	fmt.Fprintf(&b, "%s: record rev %d %s err %v;", runID, rev, v, err)
	snap := fx.snapshot()
	reads := fx.reads(committed)
	for _, step := range []string{"a", "b", "c"} {
		id := state.StepID(runID, step, 0)
		rec, ok := committed[id]
		fmt.Fprintf(&b, " step %s committed=%v (attempt %d by %s) runs=%v reads=%v;", step, ok, rec.Attempt, rec.Worker, snap[id], reads[id])
	}
	fmt.Fprintf(&b, " task publishes %v;", fx.published(runID))
	info, err := c.assets.Tasks.Info(ctxT(t, 10*time.Second), natsjs.WithSubjectFilter("jetflow.task.*."+runID+".>"))
	if err == nil {
		fmt.Fprintf(&b, " pending step tasks %v;", info.State.Subjects)
	}
	info, err = c.assets.Tasks.Info(ctxT(t, 10*time.Second), natsjs.WithSubjectFilter("jetflow.task.*."+runID))
	if err == nil {
		fmt.Fprintf(&b, " pending start task %v", info.State.Subjects)
	}
	return b.String()
}

// r3Effects is the external system the steps act on: every run of every
// step, by step ID, and whether the step was already committed when it ran,
// according to the steps bucket's leader.
type r3Effects struct {
	mu    sync.Mutex
	runs  map[string][]r3Effect
	probe *nats.Conn
	// tasks lists every publish of a task, by run ID, as core NATS carries
	// it to the stream: including the ones the stream then absorbs.
	tasks map[string][]string
	// gets and replies tap the workers' direct gets on the steps bucket
	// (the executor's reads) and their answers, by reply subject.
	gets    map[string]r3Get
	replies map[string]r3Get
}

// r3Get is a tapped direct get of a step, or its answer.
type r3Get struct {
	key   string
	at    time.Time
	found bool
}

// r3Read is one executor read of a step: when it was sent relative to the
// step's commit, and whether it found the step.
type r3Read struct {
	sinceCommit time.Duration
	found       bool
}

func (r r3Read) String() string {
	return fmt.Sprintf("%s:%v", r.sinceCommit.Round(time.Millisecond), map[bool]string{true: "found", false: "MISSED"}[r.found])
}

type r3Tri int

const (
	r3No r3Tri = iota
	r3Yes
	r3Unknown
)

type r3Effect struct {
	worker          string
	attempt         int
	at              time.Time
	committedBefore r3Tri
	sinceCommit     time.Duration // how long before the probe the step was stored, when committed
}

func (e r3Effect) String() string {
	return fmt.Sprintf("{%s attempt %d at %s committed-before %d (%s)}", e.worker, e.attempt, e.at.Format("15:04:05.000"), e.committedBefore, e.sinceCommit)
}

// effects returns the side-effect recorder, probing on its own connection.
func (e *r3Env) effects() *r3Effects {
	fx := &r3Effects{
		runs: map[string][]r3Effect{}, probe: e.cl.Conn(e.t, -1), tasks: map[string][]string{},
		gets: map[string]r3Get{}, replies: map[string]r3Get{},
	}
	getPrefix := "$JS.API.DIRECT.GET.KV_" + jetstream.StepsBucket + ".$KV." + jetstream.StepsBucket + "."
	_, err := fx.probe.Subscribe(getPrefix+">", func(m *nats.Msg) {
		fx.mu.Lock()
		defer fx.mu.Unlock()
		fx.gets[m.Reply] = r3Get{key: strings.TrimPrefix(m.Subject, getPrefix), at: time.Now()}
	})
	require.NoError(e.t, err)
	_, err = fx.probe.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if m.Header.Get("Nats-Stream") == "" && m.Header.Get("Status") == "" {
			return // not a direct get's answer
		}
		fx.mu.Lock()
		defer fx.mu.Unlock()
		fx.replies[m.Subject] = r3Get{at: time.Now(), found: m.Header.Get("Status") == ""}
	})
	require.NoError(e.t, err)
	_, err = fx.probe.Subscribe("jetflow.task.>", func(m *nats.Msg) {
		tok := strings.Split(m.Subject, ".")
		if len(tok) < 4 {
			return
		}
		what := "start"
		if len(tok) == 6 {
			what = tok[4] + "." + tok[5]
		}
		fx.mu.Lock()
		defer fx.mu.Unlock()
		fx.tasks[tok[3]] = append(fx.tasks[tok[3]], time.Now().Format("15:04:05.000")+" "+what)
	})
	require.NoError(e.t, err)
	require.NoError(e.t, fx.probe.Flush())
	return fx
}

// reads joins the tapped direct gets of steps with their answers, by step
// ID, timed against each step's commit. A read sent after the commit that
// did not find the step is a stale read.
func (fx *r3Effects) reads(committed map[string]r3StepRecord) map[string][]r3Read {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	out := map[string][]r3Read{}
	for reply, g := range fx.gets {
		ans, ok := fx.replies[reply]
		rec, committedOK := committed[g.key]
		if !ok || !committedOK {
			continue
		}
		out[g.key] = append(out[g.key], r3Read{sinceCommit: g.at.Sub(rec.Stored), found: ans.found})
	}
	for _, rs := range out {
		sort.Slice(rs, func(i, j int) bool { return rs[i].sinceCommit < rs[j].sinceCommit })
	}
	return out
}

func (fx *r3Effects) published(runID string) []string {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return append([]string(nil), fx.tasks[runID]...)
}

// r3Recorder records the step runs of one worker.
type r3Recorder struct {
	fx     *r3Effects
	worker string
}

func (fx *r3Effects) recorder(worker string) *r3Recorder {
	return &r3Recorder{fx: fx, worker: worker}
}

func (rc *r3Recorder) record(info StepDetails) {
	r := r3Effect{worker: rc.worker, attempt: info.Attempt, at: time.Now()}
	var stored time.Time
	r.committedBefore, stored = r3Committed(rc.fx.probe, info.StepID)
	if r.committedBefore == r3Yes {
		r.sinceCommit = r.at.Sub(stored)
	}
	rc.fx.mu.Lock()
	defer rc.fx.mu.Unlock()
	rc.fx.runs[info.StepID] = append(rc.fx.runs[info.StepID], r)
}

func (fx *r3Effects) snapshot() map[string][]r3Effect {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	out := make(map[string][]r3Effect, len(fx.runs))
	for k, v := range fx.runs {
		out[k] = append([]r3Effect(nil), v...)
	}
	return out
}

// r3Committed asks the steps bucket's stream leader (a message get through
// the JetStream API, which only the leader answers, not a direct get, which
// any replica answers) whether stepID is committed.
func r3Committed(nc *nats.Conn, stepID string) (r3Tri, time.Time) {
	req, _ := json.Marshal(server.JSApiMsgGetRequest{LastFor: "$KV." + jetstream.StepsBucket + "." + stepID})
	giveUp := time.Now().Add(3 * time.Second)
	for time.Now().Before(giveUp) {
		msg, err := nc.Request("$JS.API.STREAM.MSG.GET.KV_"+jetstream.StepsBucket, req, time.Second)
		if err == nil {
			var resp server.JSApiMsgGetResponse
			if json.Unmarshal(msg.Data, &resp) == nil {
				switch {
				case resp.Error == nil && resp.Message != nil:
					return r3Yes, resp.Message.Time
				case resp.Error != nil && resp.Error.ErrCode == uint16(server.JSNoMessageFoundErr):
					return r3No, time.Time{}
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // no leader for the moment
	}
	return r3Unknown, time.Time{}
}

// r3Workflow has steps a, b and c; each records its run with rec and returns
// its input plus one, so a run started with 0 outputs 3.
func r3Workflow(name string, rec *r3Recorder) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		sum := in
		for _, step := range []string{"a", "b", "c"} {
			v, err := Step(ctx, step, func(sctx context.Context) (int, error) {
				info, ok := StepDetailsFrom(sctx)
				if !ok {
					return 0, fmt.Errorf("no step info")
				}
				rec.record(info)
				return sum + 1, nil
			})
			if err != nil {
				return 0, err
			}
			sum = v
		}
		return sum, nil
	})
}

// r3StepRecord is a committed step and when the leader stored it.
type r3StepRecord struct {
	state.Step
	Stored time.Time
}

// r3CommittedSteps reads every step record in the steps bucket.
func r3CommittedSteps(t *testing.T, c *Client) map[string]r3StepRecord {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	w, err := c.assets.Steps.Raw().WatchAll(ctx, natsjs.IgnoreDeletes())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	out := map[string]r3StepRecord{}
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("reading the steps bucket: %v", ctx.Err())
		case e := <-w.Updates():
			if e == nil {
				return out
			}
			if state.IsLeaseKey(e.Key()) {
				continue // a run's lease, not a step
			}
			st, err := state.DecodeStep(e.Value())
			require.NoError(t, err)
			out[e.Key()] = r3StepRecord{Step: st, Stored: e.Created()}
		}
	}
}

// The compare-and-set helpers on a replicated bucket. The cluster answers a
// settled conflict with 10071 (as a single server does) and a conflict with a
// write still in flight on the same key with 10164; KV.Create and KV.Update
// map both to ErrExists and ErrRevisionMismatch, from every node, also when
// many writers race.
func TestClusterKVCompareAndSet(t *testing.T) {
	t.Parallel()
	env := newR3Env(t)
	var assets [testenv.ClusterSize]*jetstream.Assets
	for i := range assets {
		a, err := jetstream.Provision(ctxT(t, 30*time.Second), env.cl.Conn(t, i), env.topo, jetstream.Ensure)
		require.NoError(t, err)
		assets[i] = a
	}
	runs := assets[0].Runs
	st, err := runs.Raw().Status(ctxT(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 3, st.(*natsjs.KeyValueBucketStatus).StreamInfo().Config.Replicas)

	rev, err := runs.Create(ctxT(t, 10*time.Second), "k", []byte("first"))
	require.NoError(t, err)

	// The raw answers of the cluster. A settled conflict (the key's last
	// revision is known and differs) is 10071, as on a single server.
	casPublish := func(a *jetstream.Assets, key string, data string, last uint64) (uint64, error) {
		ack, err := a.JS.PublishMsg(context.Background(),
			&nats.Msg{Subject: "$KV." + jetstream.RunsBucket + "." + key, Data: []byte(data)},
			natsjs.WithExpectLastSequencePerSubject(last))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	}
	errCode := func(err error) natsjs.ErrorCode {
		var apiErr *natsjs.APIError
		if errors.As(err, &apiErr) {
			return apiErr.ErrorCode
		}
		return 0
	}
	_, err = casPublish(assets[1], "k", "raw", 0)
	require.Equal(t, natsjs.JSErrCodeStreamWrongLastSequence, errCode(err), "settled conflict: %v", err)
	require.True(t, jetstream.IsWrongLastSequence(err))

	// A conflict with a write of the same key still being replicated is
	// 10164: the leader refuses any expected-sequence write on a subject
	// with a proposal in flight. Race writers from all nodes on one
	// revision until the cluster answers it; every round exactly one wins,
	// and the next round races on the winner's revision.
	inflight, rounds := 0, 0
	last, err := runs.Create(ctxT(t, 10*time.Second), "hot", []byte("0"))
	require.NoError(t, err)
	for ; rounds < 100 && inflight == 0; rounds++ {
		seqs := make([]uint64, 12)
		errs := make([]error, 12)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				seqs[i], errs[i] = casPublish(assets[i%3], "hot", fmt.Sprint(rounds, "-", i), last)
			}()
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
				last = seqs[i]
			case errCode(err) == natsjs.JSErrCodeStreamWrongLastSequenceConstant:
				inflight++
				require.True(t, jetstream.IsWrongLastSequence(err))
			default:
				require.Equal(t, natsjs.JSErrCodeStreamWrongLastSequence, errCode(err), "round %d: %v", rounds, err)
			}
		}
		require.Equal(t, 1, won, "round %d: one compare-and-set wins", rounds)
	}
	require.NotZero(t, inflight, "no 10164 answer in %d rounds", rounds)
	t.Logf("in-flight conflicts (10164): %d in %d rounds of 12 racing writers", inflight, rounds)

	for i, a := range assets {
		_, err := a.Runs.Create(ctxT(t, 10*time.Second), "k", []byte(fmt.Sprint("again from ", i)))
		require.ErrorIs(t, err, jetstream.ErrExists, "node %d", i)
		_, err = a.Runs.Update(ctxT(t, 10*time.Second), "k", []byte("stale"), rev+1000)
		require.ErrorIs(t, err, jetstream.ErrRevisionMismatch, "node %d", i)
	}
	v, _, err := assets[2].Runs.GetExisting(ctxT(t, 10*time.Second), "k")
	require.NoError(t, err)
	require.Equal(t, "first", string(v))

	// 30 writers on three nodes race to create one key, then to update it
	// from the same revision: exactly one of each wins.
	const writers = 30
	race := func(op func(a *jetstream.Assets, i int) error) (won int, lost int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		ready := make(chan struct{})
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				err := op(assets[i%len(assets)], i)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won++
				case errors.Is(err, jetstream.ErrExists), errors.Is(err, jetstream.ErrRevisionMismatch):
					lost++
				default:
					t.Errorf("writer %d: unexpected error %v", i, err)
				}
			}()
		}
		close(ready)
		wg.Wait()
		return won, lost
	}
	won, lost := race(func(a *jetstream.Assets, i int) error {
		_, err := a.Runs.Create(context.Background(), "race", []byte(fmt.Sprint(i)))
		return err
	})
	require.Equal(t, 1, won)
	require.Equal(t, writers-1, lost)
	_, rev, err = assets[0].Runs.GetExisting(ctxT(t, 10*time.Second), "race")
	require.NoError(t, err)
	won, lost = race(func(a *jetstream.Assets, i int) error {
		_, err := a.Runs.Update(context.Background(), "race", []byte(fmt.Sprint("u", i)), rev)
		return err
	})
	require.Equal(t, 1, won)
	require.Equal(t, writers-1, lost)

	// Reads right after a write: a direct get (KV.Get) is a queue-group
	// request that any replica may answer (the server picks among its local
	// and routed subscribers), and a follower can lag. Count the misses,
	// from 16 writers at once; GetExisting must still find every key.
	leader := env.cl.BucketLeader(jetstream.RunsBucket)
	keys := 800
	if testing.Short() {
		keys = 160
	}
	var stale atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			follower := assets[(leader+1+w%2)%3] // a client on a follower node
			for i := w; i < keys; i += 16 {
				key := fmt.Sprint("fresh-", i)
				if _, err := assets[leader].Runs.Create(context.Background(), key, []byte("v")); err != nil {
					t.Errorf("create %s: %v", key, err)
					return
				}
				if _, _, err := follower.Runs.Get(context.Background(), key); errors.Is(err, jetstream.ErrNotFound) {
					stale.Add(1)
				} else if err != nil {
					t.Errorf("get %s: %v", key, err)
				}
				if _, _, err := follower.Runs.GetExisting(context.Background(), key); err != nil {
					t.Errorf("get existing %s: %v", key, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("direct gets right after a create acknowledged by the leader: %d of %d missed the key", stale.Load(), keys)
}

// A producer that retries a start whose reply was lost, on the clustered
// stream: the same task published twice at once (the second can meet
// "duplicate message id is in process", 10158, which PublishTask retries), and
// the same run admitted twice at once from two nodes. Exactly one is
// created, every time, and each run executes once.
func TestClusterRetriedStartLandsOnOneRun(t *testing.T) {
	t.Parallel()
	env := newR3Env(t)
	fx := env.effects()
	wf := r3Workflow("r3retry", fx.recorder("client"))
	c := env.client(0)
	var assets [testenv.ClusterSize]*jetstream.Assets
	for i := range assets {
		a, err := jetstream.Provision(ctxT(t, 30*time.Second), env.cl.Conn(t, i), env.topo, jetstream.Ensure)
		require.NoError(t, err)
		assets[i] = a
	}
	n := 40
	if testing.Short() {
		n = 20
	}
	begin := time.Now()

	// The raw broker answer: a burst of publishes of one message ID from
	// three nodes at once. Count the 10158 answers PublishTask retries.
	inProcess := 0
	for i := range n {
		subj := jetstream.RunSubject("r3raw", fmt.Sprint("raw-", i))
		errs := make([]error, 3)
		acks := make([]*natsjs.PubAck, 3)
		var wg sync.WaitGroup
		for j, a := range assets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				acks[j], errs[j] = a.JS.PublishMsg(context.Background(), &nats.Msg{Subject: subj, Data: []byte("x")},
					natsjs.WithMsgID(fmt.Sprint("raw-", i)))
			}()
		}
		wg.Wait()
		stored := 0
		for j := range errs {
			var apiErr *natsjs.APIError
			switch {
			case errs[j] == nil && !acks[j].Duplicate:
				stored++
			case errs[j] == nil:
			case errors.As(errs[j], &apiErr) && apiErr.ErrorCode == 10158:
				inProcess++
			default:
				t.Errorf("raw publish %d: %v", i, errs[j])
			}
		}
		require.Equal(t, 1, stored, "message ID raw-%d stored once", i)
	}
	t.Logf("raw concurrent publishes of one message ID from three nodes, %d times: %d answered 10158 (in process) (%s)",
		n, inProcess, time.Since(begin).Round(time.Millisecond))

	// PublishTask twice at once with one message ID, on two nodes: one is
	// stored, the other absorbed, neither fails.
	for i := range n {
		id := fmt.Sprint("pub-", i)
		subj := jetstream.RunSubject("r3pub", id)
		ds := make([]jetstream.Dedup, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ds[j], errs[j] = jetstream.PublishTask(context.Background(), assets[j].JS, subj, id, []byte("t"))
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		stored := 0
		for _, d := range ds {
			if d == jetstream.Stored {
				stored++
			}
		}
		require.Equal(t, 1, stored, "task %s stored once: %v", id, ds)
	}

	t.Logf("PublishTask twice at once, %d times: one stored each time (%s)", n, time.Since(begin).Round(time.Millisecond))

	// Admit twice at once for one run ID from two nodes (a start and its
	// retry after a lost reply), then a third time later: exactly one is
	// created and the record keeps the creator's token.
	env.r3Worker(1, "r3retry", fx)
	env.r3Worker(2, "r3retry", fx)
	admitters := []*dedupe.Admitter{dedupe.New(assets[1], dedupe.Config{}), dedupe.New(assets[2], dedupe.Config{})}
	for i := range n {
		id := fmt.Sprint("adm-", i)
		req := dedupe.Request{RunID: id, Workflow: "r3retry", Input: json.RawMessage(`0`), Source: "retry-test"}
		res := make([]dedupe.Result, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[j], errs[j] = admitters[j].Admit(context.Background(), req)
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.NotEqual(t, res[0].Outcome, res[1].Outcome, "one created, one existing: %v %v", res[0].Outcome, res[1].Outcome)
		winner := res[0]
		if res[1].Outcome == dedupe.Created {
			winner = res[1]
		}
		later, err := admitters[i%2].Admit(context.Background(), req)
		require.NoError(t, err)
		require.Equal(t, dedupe.Existing, later.Outcome)
		require.Equal(t, winner.Run.Token, later.Run.Token, "the retry lands on the run the first call created")
		require.Equal(t, int64(2), later.Duplicates)
	}
	t.Logf("Admit twice at once then once more, %d times: one created each time (%s)", n, time.Since(begin).Round(time.Millisecond))

	// The public API: a start and its retry through the client.
	h1, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("api-1"))
	require.NoError(t, err)
	h2, err := Start(ctxT(t, 10*time.Second), c, wf, 0, WithRunID("api-1"))
	require.NoError(t, err)
	require.Equal(t, OutcomeCreated, h1.Outcome)
	require.Equal(t, OutcomeExisting, h2.Outcome)

	for i := range n {
		run, err := c.WaitRun(ctxT(t, 30*time.Second), fmt.Sprint("adm-", i))
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status)
	}
	_, err = h2.Result(ctxT(t, 30*time.Second))
	require.NoError(t, err)
	snap := fx.snapshot()
	require.Len(t, snap, 3*(n+1))
	for id, runs := range snap {
		require.Len(t, runs, 1, "step %s ran %d times: %v", id, len(runs), runs)
	}
}

// The run record's TTLs on a replicated bucket: a TTLNever write carries
// "Nats-TTL: never" and stays past a shorter TTL written to another key; a
// write with a TTL expires into a marker that Latest (read from the stream
// leader) returns with the time it was stamped, from every node.
func TestClusterRunRecordTTLs(t *testing.T) {
	t.Parallel()
	env := newR3Env(t)
	var assets [testenv.ClusterSize]*jetstream.Assets
	for i := range assets {
		a, err := jetstream.Provision(ctxT(t, 30*time.Second), env.cl.Conn(t, i), env.topo, jetstream.Ensure)
		require.NoError(t, err)
		assets[i] = a
	}
	runs := assets[0].Runs
	ctx := ctxT(t, 60*time.Second)
	rev, err := runs.CreateTTL(ctx, "running", []byte("r"), jetstream.TTLNever)
	require.NoError(t, err)
	st, err := assets[0].JS.Stream(ctx, "KV_"+jetstream.RunsBucket)
	require.NoError(t, err)
	m, err := st.GetMsg(ctx, rev)
	require.NoError(t, err)
	require.Equal(t, "never", m.Header.Get(natsjs.MsgTTLHeader))

	wrote := time.Now() // before the write: the server stamps it later
	ended, err := runs.CreateTTL(ctx, "ended", []byte("e"), time.Second)
	require.NoError(t, err)
	for _, a := range assets {
		require.Eventually(t, func() bool {
			k, err := a.Runs.Latest(context.Background(), "ended")
			return err == nil && !k.Live && k.Rev > ended
		}, 20*time.Second, 50*time.Millisecond)
		k, err := a.Runs.Latest(ctx, "ended")
		require.NoError(t, err)
		require.False(t, k.Time.Before(wrote.Add(time.Second)), "marker stamped %s, written after %s", k.Time, wrote)
		require.WithinDuration(t, wrote.Add(time.Second), k.Time, 5*time.Second)
		v, got, err := a.Runs.Get(ctx, "running")
		require.NoError(t, err)
		require.Equal(t, rev, got)
		require.Equal(t, "r", string(v))
	}
}
