package workflow

// The engine's test rig: one embedded nats-server per test, the engine's
// assets provisioned on it, executors served by consume pools of their
// own, and observation points (a tap on every task and timer publish,
// the records in the buckets, the executor's hooks). Every wait is bound
// by a deadline derived from the consumers' AckWait or by the test's
// context, never a sleep.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/consume"
	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// wf is the workflow every rig serves.
const wf = "w"

// rig is one test's server, assets and observation points.
type rig struct {
	t       *testing.T
	nc      *nats.Conn
	a       *jetstream.Assets
	store   *runs.Store
	admit   *dedupe.Admitter
	ackWait time.Duration
	tap     *tap
	// clock is the executors' timer clock (Config.TimerNow): it starts at
	// real time and moves only when a test advances it.
	clock *clock

	mu    sync.Mutex
	pools []*consume.Pool // stopped together when the test ends
}

// newRig provisions a server of the test's own whose task consumers have
// AckWait ackWait.
func newRig(t *testing.T, ackWait time.Duration) *rig {
	t.Helper()
	srv := testenv.Server(t)
	nc := testenv.Conn(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a, err := jetstream.Provision(ctx, nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	r := &rig{t: t, nc: nc, a: a, store: runs.New(a), admit: dedupe.New(a, dedupe.Config{}), ackWait: ackWait,
		clock: &clock{now: time.Now()}}
	r.tap = newTap(t, a.JS, nc, testenv.Conn(t, srv), r.within())
	// Before the server and connections go, the pools stop: together, and
	// with their consumers deleted once they stop pulling, which ends
	// their open pull requests (a stopping pool waits for them, up to a
	// second: the bulk of a test's time otherwise).
	t.Cleanup(func() {
		r.mu.Lock()
		pools := r.pools
		r.mu.Unlock()
		var wg sync.WaitGroup
		for _, p := range pools {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = p.Stop(ctx)
			}()
		}
		for _, p := range pools {
			for !p.Stopping() {
				runtime.Gosched()
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, c := range []struct{ stream, name string }{
			{jetstream.TasksStream, jetstream.ConsumerName(wf, jetstream.RunTasks)},
			{jetstream.TasksStream, jetstream.ConsumerName(wf, jetstream.BranchTasks)},
			{jetstream.TimersStream, jetstream.DueConsumer},
			{jetstream.TimersStream, jetstream.ExpiryConsumer},
		} {
			_ = a.JS.DeleteConsumer(ctx, c.stream, c.name)
		}
		wg.Wait()
	})
	return r
}

// newPool is a consume pool stopped when the test ends.
func (r *rig) newPool(slots int, noAckExtension bool) *consume.Pool {
	p := consume.New(r.nc, slots, noAckExtension, testenv.Logger(r.t))
	r.mu.Lock()
	r.pools = append(r.pools, p)
	r.mu.Unlock()
	return p
}

// ctx is a context for one operation of the test.
func (r *rig) ctx() context.Context {
	ctx, cancel := context.WithTimeout(r.t.Context(), 20*time.Second)
	r.t.Cleanup(cancel)
	return ctx
}

// within is how long a test waits for something the engine does at once
// (a handful of round trips): generous under load, and still a bound.
func (r *rig) within() time.Duration { return 10*time.Second + 10*r.ackWait }

// consumer is the durable consumer of wf's tasks of kind.
func (r *rig) consumer(kind jetstream.TaskKind) natsjs.Consumer {
	r.t.Helper()
	c, err := r.a.EnsureConsumer(r.ctx(), wf, kind, jetstream.ConsumerConfig{AckWait: r.ackWait, MaxAckPending: 64})
	require.NoError(r.t, err)
	return c
}

// clock is a timer clock a test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// executor returns an executor of the rig's workflow wf with body run,
// as worker worker; tweak (may be nil) changes its configuration.
func (r *rig) executor(worker string, run func(c *Context, in json.RawMessage) (json.RawMessage, error), tweak func(*Config)) *Executor {
	cfg := Config{
		Assets: r.a, Admitter: r.admit, Logger: testenv.Logger(r.t), WorkerID: worker,
		Definitions:  map[string]Definition{wf: {Name: wf, Run: run}},
		ReleaseDelay: 20 * time.Millisecond, TimerNow: r.clock.Now,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	return NewExecutor(cfg)
}

// serve runs e's run and branch handlers on a pool of slots of its own
// (noAckExtension: the pool extends no ack deadline), stopped when the
// test ends.
func (r *rig) serve(e *Executor, slots int, noAckExtension bool) {
	r.serveHandlers(slots, noAckExtension, e.Runs(), e.Branches())
}

// serveHandlers consumes wf's run tasks with runs and its branch tasks with
// branches (nil: not consumed) on a pool of its own.
func (r *rig) serveHandlers(slots int, noAckExtension bool, runs, branches consume.Handler) {
	r.t.Helper()
	pool := r.newPool(slots, noAckExtension)
	if runs != nil {
		require.NoError(r.t, pool.Consume(r.consumer(jetstream.RunTasks), slots, runs))
	}
	if branches != nil {
		require.NoError(r.t, pool.Consume(r.consumer(jetstream.BranchTasks), slots, branches))
	}
}

// serveTimers moves due timers into the task stream (DueForwarder).
func (r *rig) serveTimers() {
	r.t.Helper()
	pool := r.newPool(2, false)
	c, err := r.a.EnsureDueConsumer(r.ctx(), jetstream.ConsumerConfig{AckWait: r.ackWait})
	require.NoError(r.t, err)
	require.NoError(r.t, pool.Consume(c, 2, &DueForwarder{JS: r.a.JS, Log: testenv.Logger(r.t)}))
}

// serveExpiries carries out due expiries (Expirer).
func (r *rig) serveExpiries() {
	r.t.Helper()
	pool := r.newPool(1, false)
	c, err := r.a.EnsureExpiryConsumer(r.ctx(), jetstream.ConsumerConfig{AckWait: r.ackWait})
	require.NoError(r.t, err)
	require.NoError(r.t, pool.Consume(c, 1, &Expirer{Assets: r.a, Log: testenv.Logger(r.t)}))
}

// fireDue advances the timer clock by d and makes every timer due by it
// fire now.
func (r *rig) fireDue(d time.Duration) int {
	r.t.Helper()
	n, err := jetstream.FireDue(r.ctx(), r.a.JS, r.a.Timers, r.clock.Advance(d))
	require.NoError(r.t, err)
	return n
}

// start admits run runID of wf with input (its start task published, its
// record created).
func (r *rig) start(runID string, input string) state.Run {
	r.t.Helper()
	res, err := r.admit.Admit(r.ctx(), dedupe.Request{RunID: runID, Workflow: wf, Input: json.RawMessage(input)})
	require.NoError(r.t, err)
	require.Equal(r.t, dedupe.Created, res.Outcome)
	return res.Run
}

// wait waits for run runID to end and returns its record.
func (r *rig) wait(runID string) state.Run {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), r.within())
	defer cancel()
	run, err := r.store.Wait(ctx, runID)
	require.NoError(r.t, err, "run %s did not end", runID)
	return run
}

// runRecord reads run runID's record.
func (r *rig) runRecord(runID string) (state.Run, uint64) {
	r.t.Helper()
	run, rev, err := r.store.Get(r.ctx(), runID)
	require.NoError(r.t, err)
	return run, rev
}

// step reads the committed record of step id (nil: none).
func (r *rig) step(id string) *state.Step {
	r.t.Helper()
	v, rev, err := r.a.Steps.Get(r.ctx(), id)
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil
	}
	require.NoError(r.t, err)
	rec, err := state.DecodeStep(v)
	require.NoError(r.t, err)
	rec.Rev = rev
	return &rec
}

// lease reads run generation identity's lease record and its revision
// (nil, 0: none).
func (r *rig) lease(identity string) (*state.Lease, uint64) {
	r.t.Helper()
	v, rev, err := r.a.Steps.Get(r.ctx(), state.LeaseKey(identity))
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil, 0
	}
	require.NoError(r.t, err)
	l, err := state.DecodeLease(v)
	require.NoError(r.t, err)
	return &l, rev
}

// putLease writes identity's lease record l whatever it held, and returns
// its revision.
func (r *rig) putLease(identity string, l state.Lease) uint64 {
	r.t.Helper()
	l.V = state.Version
	if l.At.IsZero() {
		l.At = time.Now().UTC()
	}
	b, err := state.Encode(l)
	require.NoError(r.t, err)
	rev, err := r.a.Steps.Put(r.ctx(), state.LeaseKey(identity), b)
	require.NoError(r.t, err)
	return rev
}

// attempts reads step id's attempt log (nil: none).
func (r *rig) attempts(id string) *state.AttemptLog {
	r.t.Helper()
	v, _, err := r.a.Attempts.Get(r.ctx(), id)
	if errors.Is(err, jetstream.ErrNotFound) {
		return nil
	}
	require.NoError(r.t, err)
	l, err := state.DecodeAttemptLog(v)
	require.NoError(r.t, err)
	return &l
}

// putAttempts writes step id's attempt log.
func (r *rig) putAttempts(id string, l state.AttemptLog) {
	r.t.Helper()
	l.V = state.Version
	b, err := state.Encode(l)
	require.NoError(r.t, err)
	_, err = r.a.Attempts.Put(r.ctx(), id, b)
	require.NoError(r.t, err)
}

// commitStep writes a committed record of step id of run runID with
// output, as a branch or an event would (create-if-absent).
func (r *rig) commitStep(runID, id, output string) uint64 {
	r.t.Helper()
	rec := state.Step{V: state.Version, StepID: id, RunID: runID, Name: state.StepName(id), Attempt: 1,
		Output: json.RawMessage(output), Committed: time.Now().UTC()}
	if strings.HasPrefix(rec.Name, "event=") {
		// An event, as its sender commits it: no place.
		rec.Kind, rec.EventID = state.StepEvent, "evt-"+id
	}
	b, err := state.Encode(rec)
	require.NoError(r.t, err)
	rev, err := r.a.Steps.Create(r.ctx(), id, b)
	require.NoError(r.t, err)
	return rev
}

// timers are the timers stored in JETFLOW_TIMERS and not fired yet, by
// step ID, with the task each becomes.
func (r *rig) timers() map[string]state.Task {
	r.t.Helper()
	stored, err := jetstream.StoredTimers(r.ctx(), r.a.Timers)
	require.NoError(r.t, err)
	out := make(map[string]state.Task, len(stored))
	for _, st := range stored {
		task, err := state.DecodeTask(st.Data)
		require.NoError(r.t, err)
		out[task.StepID] = task
	}
	return out
}

// pending is the task stored on subject (the zero task and false: none).
func (r *rig) pending(subject string) (state.Task, uint64, bool) {
	r.t.Helper()
	m, err := r.a.Tasks.GetLastMsgForSubject(r.ctx(), subject)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return state.Task{}, 0, false
	}
	require.NoError(r.t, err)
	task, err := state.DecodeTask(m.Data)
	require.NoError(r.t, err)
	return task, m.Sequence, true
}

// publish stores task on subject under msgID and returns its stream
// sequence.
func (r *rig) publish(subject, msgID string, task state.Task) uint64 {
	r.t.Helper()
	task.V = state.Version
	b, err := state.Encode(task)
	require.NoError(r.t, err)
	ack, err := r.a.JS.Publish(r.ctx(), subject, b, natsjs.WithMsgID(msgID))
	require.NoError(r.t, err)
	require.False(r.t, ack.Duplicate)
	return ack.Sequence
}

// wake publishes a wake of run (read at rev) about stepID under msgID.
func (r *rig) wake(run state.Run, rev uint64, stepID, msgID string) {
	r.t.Helper()
	d, err := Wake(r.ctx(), r.a, run, rev, stepID, msgID)
	require.NoError(r.t, err)
	require.Equal(r.t, jetstream.Stored, d)
}

// eventually waits for cond, polling, within the rig's bound.
func (r *rig) eventually(cond func() bool, msg string, args ...any) {
	r.t.Helper()
	require.Eventually(r.t, cond, r.within(), 2*time.Millisecond, fmt.Sprintf(msg, args...))
}

// await receives from ch within the rig's bound.
func await[T any](r *rig, ch <-chan T, what string) T {
	r.t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(r.within()):
		r.t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// never checks that nothing arrives on ch for a whole span (a bound the
// test derives from AckWait: what it rules out would have happened
// within it).
func never[T any](r *rig, ch <-chan T, span time.Duration, what string) {
	r.t.Helper()
	select {
	case v := <-ch:
		r.t.Fatalf("%s: %v", what, v)
	case <-time.After(span):
	}
}

// tap records every task and timer publish seen on the server, in order:
// a publish the stream refuses (a duplicate, a subject already holding its
// task) is seen too.
//
// It reads them and its sync messages through one subscription, on
// jetflow.> (filtered here): nats.go runs each subscription's callbacks on
// a goroutine of its own, so messages the server sent in order on two
// subscriptions may reach their callbacks in either order, and a sync
// message seen on a subscription of its own would say nothing about the
// task and timer publishes before it. Within one subscription the order is
// the server's. (A consumer's deliveries go to its pull requests' inboxes,
// which jetflow.> does not match: the tap sees publishes only.)
type tap struct {
	t    *testing.T
	pub  *nats.Conn // the connection whose publishes published orders
	sub  *nats.Subscription
	sync string // <sync>.<n>: this tap's sync subjects
	// within bounds the wait for a sync message (the rig's within).
	within time.Duration

	mu   sync.Mutex
	msgs []*nats.Msg
	// waits are the sync messages published calls wait for: closed when
	// the subscription handles them.
	waits map[string]chan struct{}
}

// tapped are the subject prefixes the tap records.
var tapped = []string{"jetflow.run.", "jetflow.branch.", "jetflow.sched."}

// newTap records the task and timer publishes sub (a connection of the
// tap's own) sees; published orders them after pub's publishes, waiting
// up to within for them. js checks that no stream stores the tap's sync
// messages.
func newTap(t *testing.T, js natsjs.JetStream, pub, sub *nats.Conn, within time.Duration) *tap {
	t.Helper()
	tp := &tap{t: t, pub: pub, sync: "jetflow.tapsync." + nuid.Next(), within: within, waits: map[string]chan struct{}{}}
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	_, err := js.StreamNameBySubject(ctx, tp.sync+".x")
	require.ErrorIs(t, err, natsjs.ErrStreamNotFound, "a stream would store the tap's sync messages")
	tp.sub, err = sub.Subscribe("jetflow.>", func(m *nats.Msg) {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, tp.sync+"."):
			if w, ok := tp.waits[m.Subject]; ok {
				close(w)
				delete(tp.waits, m.Subject)
			}
		case slices.ContainsFunc(tapped, func(p string) bool { return strings.HasPrefix(m.Subject, p) }):
			tp.msgs = append(tp.msgs, m)
		}
	})
	require.NoError(t, err)
	// Nothing the tap must see may be dropped as a slow consumer's.
	require.NoError(t, tp.sub.SetPendingLimits(-1, -1))
	require.NoError(t, sub.Flush())
	return tp
}

// published returns the publishes seen so far on subjects with prefix:
// every publish made on the rig's connection before the call is in it
// (the server keeps the connection's publishes in order, and the tap
// waits until its one subscription has handled a message the connection
// publishes last).
func (tp *tap) published(prefix string) []*nats.Msg {
	tp.t.Helper()
	want, seen := tp.sync+"."+nuid.Next(), make(chan struct{})
	tp.mu.Lock()
	tp.waits[want] = seen
	tp.mu.Unlock()
	require.NoError(tp.t, tp.pub.Publish(want, nil))
	require.NoError(tp.t, tp.pub.Flush())
	select {
	case <-seen:
	case <-time.After(tp.within):
		tp.t.Fatal("the tap did not see its sync message")
	}
	dropped, err := tp.sub.Dropped()
	require.NoError(tp.t, err)
	require.Zero(tp.t, dropped, "the tap dropped messages")
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []*nats.Msg
	for _, m := range tp.msgs {
		if strings.HasPrefix(m.Subject, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// tasks decodes msgs.
func (tp *tap) tasks(msgs []*nats.Msg) []state.Task {
	tp.t.Helper()
	out := make([]state.Task, len(msgs))
	for i, m := range msgs {
		task, err := state.DecodeTask(m.Data)
		require.NoError(tp.t, err)
		out[i] = task
	}
	return out
}

// probe is a handler that hands every delivery to a test's function, which
// settles it (or not).
type probe func(ctx context.Context, d *consume.Delivery)

func (p probe) Handle(ctx context.Context, d *consume.Delivery) { p(ctx, d) }
func (p probe) Release(msg natsjs.Msg, delay time.Duration) error {
	return consume.NakAfter(msg, delay)
}

// meta is a delivery's stream sequence and delivery count.
func meta(t *testing.T, d *consume.Delivery) (seq uint64, delivered int) {
	t.Helper()
	m, err := d.Msg.Metadata()
	require.NoError(t, err)
	return m.Sequence.Stream, int(m.NumDelivered)
}

// body helpers

// seqStep runs step name inline with the default policy.
func seqStep(c *Context, name string, fn StepFunc) (json.RawMessage, error) {
	return c.StepWithKey(name, RetryPolicy{}, TaskKey{}, fn)
}

// ok is a step function that returns v.
func ok(v string) StepFunc {
	return func(context.Context) (json.RawMessage, error) { return json.RawMessage(v), nil }
}

// retryIn is a retryable error that asks for delay d.
type retryIn time.Duration

func (e retryIn) Error() string             { return "try again in " + time.Duration(e).String() }
func (e retryIn) RetryAfter() time.Duration { return time.Duration(e) }

// fatal is an error that must not be retried, with a code.
type fatal struct{ code string }

func (e fatal) Error() string     { return "fatal: " + e.code }
func (e fatal) Fatal() bool       { return true }
func (e fatal) ErrorCode() string { return e.code }

// attemptsSeen records the attempts the executor numbers (Hooks.BeforeAttempt).
type attemptsSeen struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (a *attemptsSeen) hook(stepID string, attempt int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string][]int{}
	}
	a.seen[stepID] = append(a.seen[stepID], attempt)
}

func (a *attemptsSeen) of(stepID string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.seen[stepID]...)
}

// deliveries counts the deliveries a handler got, by subject.
type deliveries struct {
	h  consume.Handler
	mu sync.Mutex
	n  map[string][]int // delivery counts seen per subject
	// handled gets the subject of every delivery the handler returned
	// from (dropped when nobody reads it).
	handled chan string
}

func (c *deliveries) Handle(ctx context.Context, d *consume.Delivery) {
	if m, err := d.Msg.Metadata(); err == nil {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string][]int{}
		}
		c.n[d.Msg.Subject()] = append(c.n[d.Msg.Subject()], int(m.NumDelivered))
		c.mu.Unlock()
	}
	c.h.Handle(ctx, d)
	select {
	case c.handled <- d.Msg.Subject():
	default:
	}
}

func (c *deliveries) Release(msg natsjs.Msg, delay time.Duration) error {
	return c.h.Release(msg, delay)
}

// of is the delivery counts seen on subject, in order.
func (c *deliveries) of(subject string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.n[subject]...)
}

// served are the handlers of an executor a rig serves, counted.
type served struct{ runs, branches *deliveries }

// serveCounted serves e like serve (runs and/or branches), counting
// deliveries.
func (r *rig) serveCounted(e *Executor, slots int, runs, branches bool) served {
	s := served{runs: &deliveries{h: e.Runs(), handled: make(chan string, 64)},
		branches: &deliveries{h: e.Branches(), handled: make(chan string, 64)}}
	var rh, bh consume.Handler
	if runs {
		rh = s.runs
	}
	if branches {
		bh = s.branches
	}
	r.serveHandlers(slots, false, rh, bh)
	return s
}

// hooked records what an executor's hooks saw.
type hooked struct {
	attempts attemptsSeen
	parks    chan []string // Hooks.AfterPark: the waits
	finishes chan string   // Hooks.AfterFinish: the run ID
	commits  chan commitSeen
}

type commitSeen struct {
	step string
	won  bool
}

func newHooked() *hooked {
	return &hooked{parks: make(chan []string, 16), finishes: make(chan string, 16), commits: make(chan commitSeen, 64)}
}

// install sets the hooks on c.
func (h *hooked) install(c *Config) {
	c.Hooks.BeforeAttempt = h.attempts.hook
	c.Hooks.AfterPark = func(_ string, waits []string) { h.parks <- waits }
	c.Hooks.AfterFinish = func(runID string) { h.finishes <- runID }
	c.Hooks.AfterCommit = func(stepID string, won bool) { h.commits <- commitSeen{stepID, won} }
}

// msgIDs are the Nats-Msg-Id headers of msgs.
func msgIDs(msgs []*nats.Msg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Header.Get(natsjs.MsgIDHeader)
	}
	return out
}
