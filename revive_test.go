package jetflow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// nats-server issue #8505: after a kill -9 of the process that embeds the
// server, a stream whose state file (index.db, with the TTL wheel in
// thw.db) is older than its last block is rebuilt from the blocks, and the
// messages removed by a limit (a per-message TTL, a KV purge, a newer value
// of the key) before that state was written come back: a KV key returns
// with its last value and, its TTL not being in the saved wheel, never
// expires again. The engine must trust none of them: a task-key result past
// its ExpiresAt and a reset key run the step again, a liveness record of a
// worker long gone lists no worker, and a start nobody answers is told
// "retry" while no worker runs.
//
// The state is written every two minutes (plus up to 30s), and on a clean
// shutdown; the test takes the second, quicker, way: the removals happen
// while the first server process runs, their markers (a minute,
// jetstream.TaskKeyMarkerTTL and WorkflowsMarkerTTL) expire, that process
// is stopped cleanly (the state written), a second one on the same store
// writes on (so the state is stale) and is SIGKILLed, and a third comes up
// on what the blocks hold. Removals after the last state write that still
// have their marker (the late keys) are not revived by the server: they are
// checked all the same.
const (
	reviveChildEnv  = "JETFLOW_TEST_REVIVE_CHILD"
	reviveDirEnv    = "JETFLOW_TEST_REVIVE_DIR"    // the child embeds a nats-server storing there
	revivePortEnv   = "JETFLOW_TEST_REVIVE_PORT"   // its port, or the port of the server to connect to
	reviveWorkerEnv = "JETFLOW_TEST_REVIVE_WORKER" // the child runs a worker of this name
	reviveReady     = "jetflow-revive-child-ready"

	reviveWorkflowName = "revive"
	reviveLiveness     = time.Second // every worker's LivenessTTL
	// The TTL of a task key by its prefix (reviveKeyTTL).
	reviveShortTTL = 2 * time.Second
	reviveMidTTL   = 5 * time.Second
	reviveLongTTL  = 10 * time.Minute
)

func init() {
	// A child process of TestServerKilledMidLoadRevivesNothingTheEngineTrusts
	// (this test binary re-executed; see child_test.go for the pattern).
	if os.Getenv(reviveChildEnv) != "" {
		os.Exit(runReviveChild())
	}
}

// reviveKeyTTL is the TTL of task key key: short-* and late-* keys 2s,
// mid-* 5s, long-* 10 minutes.
func reviveKeyTTL(key string) time.Duration {
	switch {
	case strings.HasPrefix(key, "long-"):
		return reviveLongTTL
	case strings.HasPrefix(key, "mid-"):
		return reviveMidTTL
	}
	return reviveShortTTL
}

// reviveWorkflow calls step "lookup" with the run's input as its task key
// (workflow scope). Every execution of the step returns
// "<key>@<tag>#<n>", n counting the executions of the key in the process
// (ran), so an output tells who ran the step and whether a result is one
// seen before.
func reviveWorkflow(tag string, ran func(key string) int) *Workflow[string, string] {
	return NewWorkflow(reviveWorkflowName, func(ctx *Context, key string) (string, error) {
		return Step(ctx, "lookup", func(context.Context) (string, error) {
			return fmt.Sprintf("%s@%s#%d", key, tag, ran(key)), nil
		}, WithTaskKey(key, reviveKeyTTL(key)), WithKeyScope(ScopeWorkflow))
	})
}

// runReviveChild is the child's main: an embedded nats-server on the store
// directory and port it is given (reviveDirEnv), a worker of the revive
// workflow (reviveWorkerEnv), or both, in one process, as the worker
// command runs them. SIGTERM stops the worker (its liveness withdrawn) and
// then the server (its state written); SIGKILL kills both at once.
func runReviveChild() int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "revive child:", err)
		return 1
	}
	port, err := strconv.Atoi(os.Getenv(revivePortEnv))
	if err != nil {
		return fail(err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var srv *natsserver.Server
	if dir := os.Getenv(reviveDirEnv); dir != "" {
		srv, err = natsserver.Start(natsserver.Config{DataDir: dir, Port: port, ReadyTimeout: 30 * time.Second})
		if err != nil {
			return fail(err)
		}
		url = srv.ClientURL()
	}
	var (
		w  *Worker
		nc *nats.Conn
	)
	if name := os.Getenv(reviveWorkerEnv); name != "" {
		if nc, err = jetstream.Connect(url, name); err != nil {
			return fail(err)
		}
		ws := NewRegistry()
		if err := ws.Register(reviveWorkflow(name, newCounter().inc)); err != nil {
			return fail(err)
		}
		w, err = NewWorker(nc, ws, WorkerConfig{
			Name: name, LivenessTTL: reviveLiveness,
			Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
		})
		if err != nil {
			return fail(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = w.Start(ctx)
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	fmt.Println(reviveReady)
	<-sig
	if w != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := w.Stop(ctx)
		cancel()
		nc.Close()
		if err != nil {
			return fail(err)
		}
	}
	if srv != nil {
		srv.Shutdown()
	}
	return 0
}

// reviveProc is a running child process.
type reviveProc struct {
	name   string
	cmd    *exec.Cmd
	ready  chan struct{} // closed once it printed reviveReady
	exited chan struct{} // closed once it exited (cmd.ProcessState is set)
}

// readyWriter is a child's stdout: it closes ready at the line reviveReady.
type readyWriter struct {
	mu    sync.Mutex
	buf   []byte
	once  sync.Once
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if bytes.Contains(w.buf, []byte(reviveReady+"\n")) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

// spawnRevive starts a child (a server storing in dir unless dir is
// empty, a worker called worker unless worker is empty) and waits until it
// is ready. It is SIGKILLed when the test ends if it still runs.
func spawnRevive(t *testing.T, name, dir string, port int, worker string) *reviveProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reviveChildEnv+"=1", reviveDirEnv+"="+dir,
		revivePortEnv+"="+strconv.Itoa(port), reviveWorkerEnv+"="+worker)
	out := &readyWriter{ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	require.NoError(t, cmd.Start(), name)
	p := &reviveProc{name: name, cmd: cmd, ready: out.ready, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case <-p.ready:
	case <-p.exited:
		t.Fatalf("%s exited before it was ready: %v", name, cmd.ProcessState)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready within 60s", name)
	}
	return p
}

// kill SIGKILLs the child and waits for its death.
func (p *reviveProc) kill(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGKILL, 30*time.Second)
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "%s exited with %v, want SIGKILL", p.name, p.cmd.ProcessState)
}

// stop SIGTERMs the child (a clean stop) and waits for it to exit with 0.
func (p *reviveProc) stop(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGTERM, 60*time.Second)
	require.Zero(t, p.cmd.ProcessState.ExitCode(), "%s: %v", p.name, p.cmd.ProcessState)
}

// signal sends sig to the child and waits up to within for it to exit.
func (p *reviveProc) signal(t *testing.T, sig syscall.Signal, within time.Duration) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %s of %v", p.name, within, sig)
	}
}

// pollUntil calls cond on the test's goroutine (so it may fail the test)
// every 50ms until it holds or d has passed, and reports whether it held.
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamMsgs is the number of messages of every stream of the server.
func streamMsgs(ctx context.Context, c *Client) (map[string]uint64, error) {
	out := map[string]uint64{}
	l := c.assets.JS.ListStreams(ctx)
	for si := range l.Info() {
		out[si.Config.Name] = si.State.Msgs
	}
	return out, l.Err()
}

func TestServerKilledMidLoadRevivesNothingTheEngineTrusts(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 80s: the server's removal markers must expire (a minute) before its state is written")
	}
	t.Parallel()
	began := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	dir := t.TempDir()
	port := testenv.FreePorts(t, 1)[0]
	const (
		main1, main2    = "revive-main-1", "revive-main-2"
		stopped, killed = "revive-extra-stopped", "revive-extra-killed"
		after           = "revive-after"
		unserved        = "revive-unserved" // a workflow no worker ever served
	)

	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	// Every read of the test, polls included, is bounded by ctx.
	ctx := ctxT(t, 10*time.Minute)
	gen1 := spawnRevive(t, "server 1", dir, port, main1)
	nc, err := jetstream.Connect(url, t.Name())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c, err := NewClient(ctxT(t, 30*time.Second), nc, ClientConfig{})
	require.NoError(t, err)
	ran := newCounter() // the executions of this process's worker (started after the kill)
	wf := reviveWorkflow("parent", ran.inc)
	bkey := func(key string) string {
		k, err := state.TaskKeyName(state.ScopeWorkflow, reviveWorkflowName, "lookup", key)
		require.NoError(t, err)
		return k
	}
	taskKey := func(ctx context.Context, key string) (jetstream.KeyState, error) {
		return c.assets.TaskKeys.Latest(ctx, bkey(key))
	}
	liveness := func(ctx context.Context, id string) (jetstream.KeyState, error) {
		return c.assets.Workflows.Latest(ctx, roster.LiveKey(reviveWorkflowName, id))
	}
	// workerIDs waits until the roster lists every worker of names and
	// returns their presence IDs.
	workerIDs := func(names ...string) map[string]string {
		ids := map[string]string{}
		require.True(t, pollUntil(30*time.Second, func() bool {
			r, err := c.Roster(ctx)
			if err != nil {
				return false // the client may still be reconnecting
			}
			for _, w := range r.Workers {
				if slices.Contains(names, w.Name) {
					ids[w.Name] = w.ID
				}
			}
			return len(ids) == len(names)
		}), "workers %v not all listed: %v", names, ids)
		return ids
	}

	// Two more workers, in processes of their own: one stops (its
	// liveness withdrawn, a purge), one is killed (its liveness expires).
	e1 := spawnRevive(t, stopped, "", port, stopped)
	e2 := spawnRevive(t, killed, "", port, killed)
	ids := workerIDs(main1, stopped, killed)
	phase("server 1 and three workers running")

	// Load. Every run's output, by key, before the kill.
	outputs := map[string]map[string]bool{}
	servedN := 0
	run := func(runID, key string) {
		out, err := runKeyed(t, c, wf, runID, key)
		require.NoError(t, err, runID)
		if outputs[key] == nil {
			outputs[key] = map[string]bool{}
		}
		outputs[key][out] = true
		if served(t, c, runID) {
			servedN++
		}
	}
	runAll := func(prefix string, keys []string, per int) {
		rctx := ctxT(t, 60*time.Second)
		type started struct {
			h   *Handle[string]
			key string
		}
		var hs []started
		for _, k := range keys {
			for j := range per {
				h, err := Start(rctx, c, wf, k, WithRunID(fmt.Sprintf("%s-%s-%d", prefix, k, j)))
				require.NoError(t, err)
				hs = append(hs, started{h, k})
			}
		}
		for _, s := range hs {
			out, err := s.h.Result(rctx)
			require.NoError(t, err, s.h.RunID)
			if outputs[s.key] == nil {
				outputs[s.key] = map[string]bool{}
			}
			outputs[s.key][out] = true
			if served(t, c, s.h.RunID) {
				servedN++
			}
		}
	}
	short := []string{"short-0", "short-1", "short-2", "short-3"}
	mid := []string{"mid-0", "mid-1"}
	longReset := []string{"long-0", "long-1"}
	longKept := []string{"long-2", "long-3"}
	late := []string{"late-0", "late-1"}
	// A mid key's result (5s) is reset at once: the reset entry lives
	// what was left of it, then expires.
	for _, k := range mid {
		run("pre-"+k, k)
		n, err := c.ResetTaskKey(ctx, k, ScopeWorkflow, reviveWorkflowName)
		require.NoError(t, err)
		require.Equal(t, 1, n, "%s not reset: its result expired first (%s TTL)", k, reviveMidTTL)
	}
	runAll("pre", slices.Concat(short, longReset, longKept), 3)
	for _, k := range slices.Concat(longReset, longKept) {
		require.Len(t, outputs[k], 1, "%s: the step ran more than once within its TTL: %v", k, outputs[k])
	}
	require.GreaterOrEqual(t, servedN, 2*(len(longReset)+len(longKept)), "runs served from their key")
	for _, k := range longReset {
		n, err := c.ResetTaskKey(ctx, k, ScopeWorkflow, reviveWorkflowName)
		require.NoError(t, err)
		require.Equal(t, 1, n, k)
	}
	phase(fmt.Sprintf("load done: %d runs served from their key; %v and %v reset", servedN, mid, longReset))

	e1.stop(t)
	e2.kill(t)

	// The early removals: the results of the short keys (TTL), the reset
	// entries of the mid keys (TTL), the liveness records of the stopped
	// (purge) and of the killed (TTL) worker.
	type removed struct {
		what string
		read func(context.Context) (jetstream.KeyState, error)
	}
	var early []removed
	for _, k := range slices.Concat(short, mid) {
		early = append(early, removed{"task key " + k, func(ctx context.Context) (jetstream.KeyState, error) { return taskKey(ctx, k) }})
	}
	for _, name := range []string{stopped, killed} {
		id := ids[name]
		early = append(early, removed{"liveness of " + name, func(ctx context.Context) (jetstream.KeyState, error) { return liveness(ctx, id) }})
	}
	// allEarly reports whether every early removal's last message passes
	// ok.
	allEarly := func(ok func(jetstream.KeyState) bool) (bool, []string) {
		var not []string
		for _, r := range early {
			st, err := r.read(ctx)
			require.NoError(t, err, r.what)
			if !ok(st) {
				not = append(not, r.what)
			}
		}
		return len(not) == 0, not
	}
	var left []string
	require.True(t, pollUntil(reviveMidTTL+2*reviveLiveness+30*time.Second, func() bool {
		var done bool
		done, left = allEarly(func(st jetstream.KeyState) bool { return !st.Live })
		return done
	}), "not removed: %v", left)
	phase("early removals done; waiting for their markers to expire")
	markersGone := pollUntil(jetstream.TaskKeyMarkerTTL+jetstream.WorkflowsMarkerTTL, func() bool {
		var done bool
		done, left = allEarly(func(st jetstream.KeyState) bool { return st.Rev == 0 })
		return done
	})
	if !markersGone {
		t.Logf("markers of early removals still present (%v): the server will not revive those keys", left)
	}

	// Server 1 stops cleanly: its state (index.db, thw.db) is written
	// after the early removals. Server 2 writes on (its worker's
	// heartbeats, the late keys), so that state is stale when it is
	// killed.
	gen1.stop(t)
	phase("server 1 stopped cleanly (state written); server 2 starting")
	gen2 := spawnRevive(t, "server 2", dir, port, main2)
	ids[main2] = workerIDs(main2)[main2]
	runAll("late", late, 2)
	require.True(t, pollUntil(reviveShortTTL+30*time.Second, func() bool {
		for _, k := range late {
			if st, err := taskKey(ctx, k); err != nil || st.Live {
				return false
			}
		}
		return true
	}), "late keys not expired")
	before, err := streamMsgs(ctx, c)
	require.NoError(t, err)
	killedAt := time.Now()
	gen2.kill(t)
	phase("server 2 killed (SIGKILL) with its worker")

	spawnRevive(t, "server 3", dir, port, "") // no worker; SIGKILLed when the test ends
	var afterRestart map[string]uint64
	require.True(t, pollUntil(30*time.Second, func() bool {
		afterRestart, err = streamMsgs(ctx, c)
		return err == nil
	}), "the client did not reconnect: %v", err)
	phase("server 3 up, no worker")

	// What came back. A removed key that holds a value now was revived.
	// The late keys were removed after the last state write.
	var revived, checked []string
	lateRevived := 0
	see := func(what string, st jetstream.KeyState, detail string) {
		if strings.HasPrefix(what, "task key late-") {
			if st.Live {
				lateRevived++
			}
			return
		}
		checked = append(checked, what)
		if st.Live {
			revived = append(revived, fmt.Sprintf("%s (%s)", what, detail))
		}
	}
	for _, k := range slices.Concat(short, mid, late) {
		st, err := taskKey(ctx, k)
		require.NoError(t, err)
		detail := ""
		if st.Live {
			e, err := state.DecodeTaskKeyEntry(st.Value)
			require.NoError(t, err, k)
			detail = fmt.Sprintf("%s, expired %s ago", e.State, time.Since(e.ExpiresAt).Round(time.Second))
		}
		see("task key "+k, st, detail)
	}
	for _, name := range []string{main1, stopped, killed} {
		st, err := liveness(ctx, ids[name])
		require.NoError(t, err)
		detail := ""
		if st.Live {
			var l roster.Live
			require.NoError(t, json.Unmarshal(st.Value, &l))
			detail = fmt.Sprintf("beat %s ago", time.Since(l.Beat).Round(time.Second))
		}
		see("liveness of "+name, st, detail)
	}
	// A reset long key must still hold its reset entry: the result it
	// replaced coming back would be served, within its TTL.
	for _, k := range longReset {
		st, err := taskKey(ctx, k)
		require.NoError(t, err)
		require.True(t, st.Live, "%s lost its reset entry", k)
		e, err := state.DecodeTaskKeyEntry(st.Value)
		require.NoError(t, err)
		checked = append(checked, "task key "+k)
		if e.State != state.TaskKeyReset {
			revived = append(revived, fmt.Sprintf("task key %s (its %s entry over the reset)", k, e.State))
		}
	}
	t.Logf("nats-server #8505: %d of %d keys removed before the last state write came back after the kill: %v", len(revived), len(checked), revived)
	t.Logf("%d of %d keys removed after it (their markers still there) came back", lateRevived, len(late))
	var grown []string
	for _, name := range slices.Sorted(maps.Keys(afterRestart)) {
		if afterRestart[name] > before[name] {
			grown = append(grown, fmt.Sprintf("%s %d -> %d", name, before[name], afterRestart[name]))
		}
	}
	t.Logf("streams holding more messages after the restart than before the kill: %v", grown)

	// (b) No worker runs: the roster lists none but the killed one, and
	// that one only within two of its liveness TTLs of its death; it never
	// lists a worker whose liveness ended before the kill, come back or
	// not.
	dead := map[string]bool{main1: true, stopped: true, killed: true}
	checkRoster := func(running ...string) (Roster, bool) {
		asked := time.Now()
		r, err := c.Roster(ctx)
		if err != nil {
			return r, false
		}
		for _, w := range r.Workers {
			require.False(t, dead[w.Name], "the roster lists %s, whose liveness ended before the kill: %+v", w.Name, w)
			if w.Name == main2 {
				require.True(t, asked.Before(killedAt.Add(2*reviveLiveness)),
					"the roster lists %s, killed %s before", w.Name, asked.Sub(killedAt))
				continue
			}
			require.Contains(t, running, w.Name, "the roster lists a worker that is not running: %+v", w)
		}
		for _, kw := range r.Workflows {
			for _, name := range kw.Workers {
				require.False(t, dead[name], "workflow %s served by %s", kw.Workflow, name)
			}
		}
		return r, true
	}
	require.True(t, pollUntil(2*reviveLiveness+30*time.Second, func() bool {
		r, ok := checkRoster()
		return ok && len(r.Workers) == 0
	}), "the roster still lists workers")
	phase("the roster lists no worker")

	// (c) A start nobody answers, while no worker runs, is to be retried:
	// of the known workflow, and of a name no worker served yet (whose
	// workers may be still to come). A liveness record that came back
	// must not make the second final (unknown workflow).
	for _, tc := range []struct {
		name, first string
	}{{reviveWorkflowName, main1}, {unserved, ""}} {
		_, err := c.StartByName(ctxT(t, 10*time.Second), tc.name, json.RawMessage(`"short-0"`), WithRunID("nobody-"+tc.name))
		var nw *NoWorkerError
		require.ErrorAs(t, err, &nw, tc.name)
		require.ErrorIs(t, err, ErrNoWorker)
		require.ErrorIs(t, err, ErrUnavailable)
		require.NotErrorIs(t, err, ErrUnknownWorkflow)
		require.Equal(t, tc.first, nw.FirstWorker, tc.name)
		checkRoster()
	}

	// A worker again, in this process: the roster lists it alone, and now
	// the name no worker ever served is unknown.
	nc3, err := jetstream.Connect(url, t.Name()+"-worker")
	require.NoError(t, err)
	t.Cleanup(nc3.Close)
	w3 := startWorker(t, nc3, WorkerConfig{Name: after, LivenessTTL: reviveLiveness}, wf)
	stopAtEnd(t, w3, 10*time.Second)
	require.True(t, pollUntil(30*time.Second, func() bool {
		r, ok := checkRoster(after)
		return ok && len(r.Workers) == 1 && r.Workers[0].Name == after
	}), "the roster does not list the running worker")
	_, err = c.StartByName(ctxT(t, 10*time.Second), unserved, json.RawMessage(`"x"`), WithRunID("nobody-unserved-2"))
	require.ErrorIs(t, err, ErrUnknownWorkflow, "with a worker running, a name none served is unknown")
	phase("worker running in the test process")

	// (a) Every key whose result expired or was reset runs its step again,
	// here and once; the keys kept within their TTL are served their
	// result from before the kill.
	for _, k := range slices.Concat(short, mid, longReset, late) {
		id := "post-" + k
		out, err := runKeyed(t, c, wf, id, k)
		require.NoError(t, err, k)
		require.False(t, outputs[k][out], "%s served a result from before the kill: %s", k, out)
		require.Equal(t, k+"@parent#1", out, "%s: the step did not run here, once", k)
		require.False(t, served(t, c, id), k)
	}
	for _, k := range longKept {
		id := "post-" + k
		out, err := runKeyed(t, c, wf, id, k)
		require.NoError(t, err, k)
		require.True(t, outputs[k][out], "%s: its result within its TTL was not served: %s", k, out)
		require.True(t, served(t, c, id), k)
		require.Zero(t, ran.get(k), k)
	}
	checkRoster(after)
	phase("done")
}
