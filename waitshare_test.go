package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// Outside-client tests of the waiters' shared watch (issue 16): what a
// user of WaitRun and Handle.Result sees, and what an operator sees on the
// server, against a real embedded nats-server.

// waitShareCheck is the shared watch's check period as docs/operations.md
// documents it ("every 5 s"; the watch "stops 5 to 10 s after the last
// wait returned"). Every allowance of these tests derives from it.
const waitShareCheck = 5 * time.Second

// waitShareAckWait is the workers' AckWait in these tests: a task whose
// ack was lost in a NATS restart is redelivered after it.
const waitShareAckWait = 2 * time.Second

// gates releases runs one input at a time: the step of the run with input
// i blocks until open(i).
type gates struct {
	mu sync.Mutex
	ch map[int]chan struct{}
}

func newGates() *gates { return &gates{ch: make(map[int]chan struct{})} }

func (g *gates) get(i int) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.ch[i]
	if !ok {
		c = make(chan struct{})
		g.ch[i] = c
	}
	return c
}

// open lets the runs with input i finish (idempotent).
func (g *gates) open(i int) {
	c := g.get(i)
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

// gatedFlow is a workflow whose one step, "hold", blocks until its input's
// gate opens and returns input*2.
func gatedFlow(name string, g *gates, opts ...WorkflowOption) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		return Step(ctx, "hold", func(sctx context.Context) (int, error) {
			select {
			case <-g.get(in):
				return in * 2, nil
			case <-sctx.Done():
				return 0, sctx.Err()
			}
		})
	}, opts...)
}

// waitShareEnv is an embedded server, a worker serving gatedFlow "wsgate"
// (without a sweeper, whose passes would add watches of the runs bucket of
// their own), and a client.
func waitShareEnv(t *testing.T, opts ...WorkflowOption) (*testEnv, *gates, *Workflow[int, int], *Client) {
	t.Helper()
	env := newEnv(t, Topology{})
	g := newGates()
	wf := gatedFlow("wsgate", g, opts...)
	env.worker(WorkerConfig{SweepInterval: -1, AckWait: waitShareAckWait, Concurrency: 64}, wf)
	// Registered after the worker's stop, so run before it: a test that
	// failed midway leaves no step blocked for the drain.
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, c := range g.ch {
			select {
			case <-c:
			default:
				close(c)
			}
		}
	})
	return env, g, wf, env.client()
}

// runsConsumers is the number of consumers on the runs bucket's stream, as
// an operator reads it (stream info State.Consumers).
func runsConsumers(ctx context.Context, js natsjs.JetStream) (int, error) {
	s, err := js.Stream(ctx, "KV_"+jetstream.RunsBucket)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.Consumers, nil
}

// operatorJS is a JetStream context on a connection of its own.
func operatorJS(t *testing.T, env *testEnv) natsjs.JetStream {
	t.Helper()
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	return js
}

// requireConsumersGone fails t unless the runs bucket has no consumer
// within two check periods (the documented 5 to 10 s) and one more of
// allowance for the stream info round trips on a busy machine.
func requireConsumersGone(t *testing.T, js natsjs.JetStream) {
	t.Helper()
	began := time.Now()
	require.Eventually(t, func() bool {
		n, err := runsConsumers(ctxT(t, waitShareCheck), js)
		return err == nil && n == 0
	}, 3*waitShareCheck, 50*time.Millisecond, "the shared watch outlived its last wait by more than 2 check periods")
	t.Logf("the shared watch was gone %s after the last wait returned", time.Since(began).Round(time.Millisecond))
}

// oneConsumerWhileWaiting waits until the shared watch shows up on the
// server (within a check period), then samples the count until done is
// closed; it reports an error if there was none, or ever more than one.
func oneConsumerWhileWaiting(js natsjs.JetStream, done <-chan struct{}) error {
	count := func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitShareCheck)
		defer cancel()
		n, err := runsConsumers(ctx, js)
		if err == nil && n > 1 {
			err = fmt.Errorf("%d consumers on the runs bucket: waits on one client must share one", n)
		}
		return n, err
	}
	deadline := time.Now().Add(waitShareCheck)
	for {
		n, err := count()
		if err != nil {
			return err
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("no watch of the runs bucket while runs are awaited")
		}
	}
	for {
		select {
		case <-done:
			return nil
		default:
		}
		if _, err := count(); err != nil {
			return err
		}
	}
}

// startGated starts runs ws-<i> with input i for i in [0, n).
func startGated(t *testing.T, c *Client, wf *Workflow[int, int], n int) {
	t.Helper()
	for i := range n {
		h, err := Start(ctxT(t, 10*time.Second), c, wf, i, WithRunID(fmt.Sprintf("ws-%d", i)))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, h.Outcome)
	}
}

// checkFinal is nil if r is the completed run runID with output 2*in.
func checkFinal(r Run, runID string, in int) error {
	if r.RunID != runID || r.Status != StatusCompleted || string(r.Output) != fmt.Sprint(2*in) {
		return fmt.Errorf("wait for %s got %s %s output %s", runID, r.RunID, r.Status, r.Output)
	}
	return nil
}

// Hundreds of waits, several per run, by WaitRun and Handle.Result, cost
// the server one consumer; waits cancelled midway return their context's
// error at once and disturb none of the others; an unknown run ID gets
// ErrRunNotFound well within a check period while they all wait; and once
// every wait returned, the consumer goes away within two check periods.
func TestWaitShareManyWaitsCancelsAndUnknown(t *testing.T) {
	t.Parallel()
	env, g, wf, c := waitShareEnv(t)
	js := operatorJS(t, env)
	const runsN, perRun = 100, 10 // 1000 waits: per run 7 WaitRun, 1 Result, 2 cancelled
	startGated(t, c, wf, runsN)
	n, err := runsConsumers(ctxT(t, waitShareCheck), js)
	require.NoError(t, err)
	require.Zero(t, n, "no watch before anybody waits")

	waitCtx := ctxT(t, 10*waitShareCheck)
	cancelCtx, cancelSome := context.WithCancel(waitCtx)
	defer cancelSome()
	kept := make(chan error, runsN*perRun)
	cancelled := make(chan error, runsN*perRun)
	var wg sync.WaitGroup
	for i := range runsN {
		id := fmt.Sprintf("ws-%d", i)
		for k := range perRun {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch {
				case k < 2:
					_, err := c.WaitRun(cancelCtx, id)
					cancelled <- err
				case k == 2:
					out, err := (&Handle[int]{RunID: id, client: c}).Result(waitCtx)
					if err == nil && out != 2*i {
						err = fmt.Errorf("result of %s: %d, want %d", id, out, 2*i)
					}
					kept <- err
				default:
					r, err := c.WaitRun(waitCtx, id)
					if err == nil {
						err = checkFinal(r, id, i)
					}
					kept <- err
				}
			}()
		}
	}
	sampling := make(chan struct{})
	sampled := make(chan error, 1)
	go func() { sampled <- oneConsumerWhileWaiting(js, sampling) }()

	// An unknown run ID is answered promptly, while the others wait.
	began := time.Now()
	_, err = c.WaitRun(ctxT(t, waitShareCheck), "ws-unknown")
	require.ErrorIs(t, err, ErrRunNotFound)
	require.Less(t, time.Since(began), waitShareCheck, "ErrRunNotFound must not wait for a check")

	// Cancelled waits return their context's error; nothing else returns.
	cancelSome()
	for range runsN * 2 {
		select {
		case err := <-cancelled:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(waitShareCheck):
			t.Fatal("a cancelled wait did not return within a check period")
		}
	}
	select {
	case err := <-kept:
		t.Fatalf("a wait returned before its run ended: %v", err)
	default:
	}

	// Runs end one by one; every remaining wait gets its own run's end.
	released := time.Now()
	for i := range runsN {
		g.open(i)
	}
	for range runsN * (perRun - 2) {
		require.NoError(t, <-kept)
	}
	t.Logf("%d waits on %d runs returned %s after the runs' release", runsN*(perRun-2), runsN, time.Since(released).Round(time.Millisecond))
	wg.Wait()
	close(sampling)
	require.NoError(t, <-sampled)
	requireConsumersGone(t, js)
}

// Waits in flight while the NATS server restarts (same store directory and
// port), at once or after two check periods down, each return their run's final state once it ends, within a few
// check periods of the reconnect, and the watch goes away afterwards.
func TestWaitShareAcrossServerRestart(t *testing.T) {
	t.Parallel()
	for _, down := range []time.Duration{0, 2 * waitShareCheck} {
		t.Run(fmt.Sprintf("down=%s", down), func(t *testing.T) {
			t.Parallel()
			waitAcrossRestart(t, down)
		})
	}
}

// waitAcrossRestart is TestWaitShareAcrossServerRestart with the server
// down for down (0: a restart at once).
func waitAcrossRestart(t *testing.T, down time.Duration) {
	env, g, wf, c := waitShareEnv(t)
	js := operatorJS(t, env)
	const runsN = 40
	startGated(t, c, wf, runsN)

	// Before the restart, then after it: the allowance is the reconnect
	// and a silent watch's replacement (two check periods), and the
	// redelivery of a task whose ack was lost (a few AckWaits).
	allowance := 4*waitShareCheck + 4*waitShareAckWait
	waitCtx := ctxT(t, 2*allowance+down)
	errs := make(chan error, 2*runsN)
	for i := range runsN {
		id := fmt.Sprintf("ws-%d", i)
		go func() {
			r, err := c.WaitRun(waitCtx, id)
			if err == nil {
				err = checkFinal(r, id, i)
			}
			errs <- err
		}()
		go func() {
			out, err := (&Handle[int]{RunID: id, client: c}).Result(waitCtx)
			if err == nil && out != 2*i {
				err = fmt.Errorf("result of %s: %d, want %d", id, out, 2*i)
			}
			errs <- err
		}()
	}
	// The watch is up (the waits are in flight), and half the runs end
	// before the restart.
	require.Eventually(t, func() bool {
		n, err := runsConsumers(ctxT(t, waitShareCheck), js)
		return err == nil && n == 1
	}, waitShareCheck, 10*time.Millisecond)
	for i := range runsN / 2 {
		g.open(i)
	}
	for range runsN {
		require.NoError(t, <-errs)
	}

	if down > 0 {
		env.srv.Shutdown()
		outage := time.NewTimer(down) // the outage itself, not a synchronisation
		<-outage.C
	}
	require.NoError(t, env.srv.Restart())
	released := time.Now()
	for i := runsN / 2; i < runsN; i++ {
		g.open(i)
	}
	// When the last run ended, as a reader of the records sees it.
	ended := make(chan time.Time, 1)
	go func() { ended <- lastEnd(waitCtx, c, runsN/2, runsN) }()
	deadline := time.After(allowance)
	for range runsN {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-deadline:
			t.Fatalf("waits across a NATS restart did not return within %s of their runs' release", allowance)
		}
	}
	returned := time.Now()
	end := <-ended
	require.False(t, end.IsZero(), "the runs' records were not read as ended")
	t.Logf("%d runs released after a NATS restart ended %s after release; their waits returned %s after release, %s after the last end",
		runsN/2, end.Sub(released).Round(time.Millisecond), returned.Sub(released).Round(time.Millisecond), returned.Sub(end).Round(time.Millisecond))
	// docs/operations.md: a waiter "learns of the end at most about 10 s
	// late" (two check periods); half a period of allowance for a busy
	// machine.
	require.Less(t, returned.Sub(end), 2*waitShareCheck+waitShareCheck/2, "waits learnt of the end later than documented")
	requireConsumersGone(t, js)
}

// lastEnd polls the records of runs ws-<from>..ws-<to-1> until all are
// final and returns when that was seen (zero if ctx ended first). NATS
// errors while it reconnects are polled through.
func lastEnd(ctx context.Context, c *Client, from, to int) time.Time {
	for i := from; i < to; {
		r, err := c.GetRun(ctx, fmt.Sprintf("ws-%d", i))
		switch {
		case ctx.Err() != nil:
			return time.Time{}
		case err == nil && r.Status.Terminal():
			i++
		default:
			select {
			case <-ctx.Done():
				return time.Time{}
			case <-time.After(20 * time.Millisecond): // a poll interval, not a synchronisation
			}
		}
	}
	return time.Now()
}

// A run started again under its run ID (StartNew after completed) is
// waited for generation by generation: a wait begun while a generation
// runs returns the final state of that generation or a later one, never an
// earlier one, and never hangs, also when the next generation starts at
// once.
func TestWaitShareStartNewGenerations(t *testing.T) {
	t.Parallel()
	env, g, wf, c := waitShareEnv(t, WithDefaultConflictPolicy(ConflictPolicy{AfterCompleted: StartNew}))
	js := operatorJS(t, env)
	const id = "ws-gen"
	wait := func(ctx context.Context) <-chan Run {
		ch := make(chan Run, 1)
		go func() {
			r, err := c.WaitRun(ctx, id)
			if err != nil {
				t.Errorf("wait for %s: %v", id, err)
			}
			ch <- r
		}()
		return ch
	}
	start := func(in int, want Outcome) {
		t.Helper()
		h, err := Start(ctxT(t, 10*time.Second), c, wf, in, WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, want, h.Outcome)
	}
	// Waits begun while generation gen (input gen) runs.
	waitsFor := func() []<-chan Run {
		var ws []<-chan Run
		for range 5 {
			ws = append(ws, wait(ctxT(t, 4*waitShareCheck)))
		}
		return ws
	}
	// outputOf is the input of the generation r ended, checked against
	// the generation counter: generation g (from 1) has input g.
	outputOf := func(r Run) int {
		var out int
		require.NoError(t, json.Unmarshal(r.Output, &out), "output %s", r.Output)
		require.Equal(t, out/2-1, r.Generation, "output %s of generation %d", r.Output, r.Generation)
		return out / 2
	}

	start(1, OutcomeCreated)
	ws := waitsFor()
	g.open(1)
	for _, w := range ws {
		r := <-w
		require.Equal(t, StatusCompleted, r.Status)
		require.Equal(t, 1, outputOf(r))
	}

	start(2, OutcomeRestarted)
	ws = waitsFor()
	g.open(2)
	for _, w := range ws {
		r := <-w
		require.Equal(t, StatusCompleted, r.Status)
		require.Equal(t, 2, outputOf(r), "a wait begun in generation 2 got another generation")
	}

	// Generation 3 ends and generation 4 starts at once: waits begun in
	// generation 3 get generation 3's or 4's end.
	start(3, OutcomeRestarted)
	ws = waitsFor()
	g.open(3)
	g.open(4)
	r, err := c.WaitRun(ctxT(t, 4*waitShareCheck), id)
	require.NoError(t, err)
	require.Equal(t, 3, outputOf(r))
	start(4, OutcomeRestarted)
	for _, w := range ws {
		r := <-w
		require.Equal(t, StatusCompleted, r.Status)
		require.Contains(t, []int{3, 4}, outputOf(r))
	}
	r, err = c.WaitRun(ctxT(t, 4*waitShareCheck), id)
	require.NoError(t, err)
	require.Contains(t, []int{3, 4}, outputOf(r))
	requireConsumersGone(t, js)
}

// A wait whose context's deadline has passed returns the deadline's error,
// as WaitRun documents ("ctx's error (not ErrUnavailable)"), also while
// the shared watch is up for other waits: a caller that retries
// ErrUnavailable must not retry a wait it bounded itself.
func TestWaitShareExpiredDeadlineIsNotUnavailable(t *testing.T) {
	t.Parallel()
	env, g, wf, c := waitShareEnv(t)
	js := operatorJS(t, env)
	startGated(t, c, wf, 1)
	// A wait in flight keeps the shared watch up.
	held := make(chan error, 1)
	go func() {
		r, err := c.WaitRun(ctxT(t, 4*waitShareCheck), "ws-0")
		if err == nil {
			err = checkFinal(r, "ws-0", 0)
		}
		held <- err
	}()
	require.Eventually(t, func() bool {
		n, err := runsConsumers(ctxT(t, waitShareCheck), js)
		return err == nil && n == 1
	}, waitShareCheck, 10*time.Millisecond)

	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	unavailable := 0
	const tries = 200
	for range tries {
		_, err := c.WaitRun(expired, "ws-0")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		if errors.Is(err, ErrUnavailable) {
			if unavailable == 0 {
				t.Logf("a wait with an expired deadline: %v", err)
			}
			unavailable++
		}
	}
	require.Zero(t, unavailable, "waits of %d with an expired deadline returned ErrUnavailable (a retryable answer)", tries)

	g.open(0)
	require.NoError(t, <-held)
	requireConsumersGone(t, js)
}
