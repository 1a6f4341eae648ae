package jetflow

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/workflow"
)

// A crash test runs the worker in a child process (this test binary,
// re-executed) and lets it SIGKILL itself at an exact point, so the broker
// sees a real process death: no ack, no nak, no goodbye.
const (
	childEnv       = "JETFLOW_TEST_CHILD"
	childURLEnv    = "JETFLOW_TEST_NATS_URL"
	childCrashEnv  = "JETFLOW_TEST_CRASH" // "after-commit", "mid-step", "slow", "after-first-branch", "after-child-start", "after-create" or "before-index"
	childEffectEnv = "JETFLOW_TEST_EFFECTS_URL"
	childAckEnv    = "JETFLOW_TEST_ACK_WAIT" // the child's AckWait when not childAckWait
	crashStep      = "b"
	childAckWait   = time.Second
	childReady     = "jetflow-child-ready" // a child's stdout line once its worker started
)

// childLivenessTTL is the children's WorkerConfig.LivenessTTL: the
// shortest, so that a killed child's liveness record expires soon.
const childLivenessTTL = time.Second

// crashWorkflow has steps a, b, c; every attempt of every step reports its
// step ID and attempt to the parent's effects server before returning.
func crashWorkflow(effectsURL string, beforeReturn func(info StepDetails)) *Workflow[int, int] {
	return NewWorkflow("crashy", func(ctx *Context, in int) (int, error) {
		sum := in
		for _, name := range []string{"a", "b", "c"} {
			v, err := Step(ctx, name, func(sctx context.Context) (int, error) {
				info, _ := StepDetailsFrom(sctx)
				if err := reportEffect(sctx, effectsURL, info); err != nil {
					return 0, err
				}
				if beforeReturn != nil {
					beforeReturn(info)
				}
				return sum + 1, nil
			}, WithBackoff(50*time.Millisecond, 100*time.Millisecond))
			if err != nil {
				return 0, err
			}
			sum = v
		}
		return sum, nil
	})
}

func reportEffect(ctx context.Context, base string, info StepDetails) error {
	q := url.Values{"step": {info.StepID}, "attempt": {strconv.Itoa(info.Attempt)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns
}

// runChildWorker is the child process's main.
func runChildWorker() int {
	// As cmd/worker does: a SIGTERM from the very start drains, it never
	// kills the process outright.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	crash := os.Getenv(childCrashEnv)
	effects := os.Getenv(childEffectEnv)
	var hooks workflow.Hooks
	beforeReturn := func(StepDetails) {}
	switch crash {
	case "after-commit":
		hooks.AfterCommit = func(stepID string, _ bool) {
			if stepID == "crash-1."+crashStep+".0" {
				killSelf()
			}
		}
	case "after-create":
		// Dies once it created the record of a run it admits.
		hooks.AfterCreate = func(runID string) {
			if runID == "crash-1" {
				killSelf()
			}
		}
	case "before-index":
		hooks.BeforeIndex = func(runID string) {
			if runID == "crash-1" {
				killSelf()
			}
		}
	case "slow":
		// Steps take a few milliseconds after their side effect, so that
		// kills from the test land inside steps as well as between them.
		beforeReturn = func(StepDetails) {
			time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
		}
	case "mid-step":
		beforeReturn = func(info StepDetails) {
			if info.StepName == crashStep && info.Attempt == 1 {
				killSelf()
			}
		}
	case "after-first-branch":
		// Dies once the start task of a fan-out committed its first
		// branch, before it published the other branches' tasks.
		hooks.AfterCommit = func(stepID string, _ bool) {
			if strings.HasSuffix(stepID, ".branch.0") {
				killSelf()
			}
		}
	case "after-child-start":
		// Dies once a child run is admitted, before the parent's task that
		// started it is acknowledged.
		hooks.AfterChildStart = func(string, string) { killSelf() }
	}
	nc, err := jetstream.Connect(os.Getenv(childURLEnv), "child-worker")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	// The parallel and child workflows report their steps' side effects as
	// the crash workflow does, slowed the same way.
	report := func(ctx context.Context, info StepDetails) error {
		if crash == "after-child-start" && strings.Contains(info.StepID, "=kid=") {
			// This process dies once it admitted a child: it must not
			// start the child's first step in the moment before (that
			// step would run again after, a crash mid-step, which is not
			// what its test is about).
			<-ctx.Done()
			return ctx.Err()
		}
		if err := reportEffect(ctx, effects, info); err != nil {
			return err
		}
		if crash == "slow" {
			beforeReturn(info)
		}
		return nil
	}
	ackWait := childAckWait
	if v := os.Getenv(childAckEnv); v != "" {
		if ackWait, err = time.ParseDuration(v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	cfg := WorkerConfig{
		AckWait: ackWait, LivenessTTL: childLivenessTTL, hooks: hooks,
		Logger: zerolog.New(os.Stderr).Level(zerolog.WarnLevel),
	}
	wfs := []Registrable{crashWorkflow(effects, beforeReturn), fanOutFault(report), parentFault(report), kidFault(report)}
	for _, extra := range childExtras {
		wfs = append(wfs, extra(crash, effects, &cfg)...)
	}
	ws := NewRegistry()
	if err := ws.Register(wfs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w, err := NewWorker(nc, ws, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := w.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(childReady) // for waitReady
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// effectLog is the parent's record of every step attempt the children made.
type effectLog struct {
	mu       sync.Mutex
	attempts map[string][]int
	changed  chan struct{}
}

func newEffectServer(t *testing.T) (*effectLog, string) {
	l := &effectLog{attempts: make(map[string][]int), changed: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := strconv.Atoi(r.URL.Query().Get("attempt"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		l.mu.Lock()
		l.attempts[r.URL.Query().Get("step")] = append(l.attempts[r.URL.Query().Get("step")], a)
		l.mu.Unlock()
		select {
		case l.changed <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(srv.Close)
	return l, srv.URL
}

func (l *effectLog) get(stepID string) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.attempts[stepID]...)
}

// startChild starts a worker process; crash selects its fault.
func startChild(t *testing.T, env *testEnv, crash, effectsURL string) *exec.Cmd {
	t.Helper()
	cmd, err := spawnChild(t, env, crash, effectsURL)
	require.NoError(t, err)
	return cmd
}

// spawnChild is startChild for goroutines other than the test's: it
// returns the error instead of failing the test. The process is stopped
// with SIGTERM when the test ends, unless it was waited for.
func spawnChild(t *testing.T, env *testEnv, crash, effectsURL string) (*exec.Cmd, error) {
	return spawnChildAckWait(t, env, crash, effectsURL, childAckWait)
}

// spawnChildAckWait is spawnChild with the child worker's AckWait.
func spawnChildAckWait(t *testing.T, env *testEnv, crash, effectsURL string, ackWait time.Duration) (*exec.Cmd, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1", childURLEnv+"="+env.srv.ClientURL(),
		childCrashEnv+"="+crash, childEffectEnv+"="+effectsURL, childAckEnv+"="+ackWait.String())
	cmd.Stderr = os.Stderr
	ready := make(chan struct{})
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { // until the child exits and its stdout closes
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == childReady {
				close(ready)
			}
		}
	}()
	childrenReady.Store(cmd, ready)
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	return cmd, nil
}

// childExtras are more workflows for every child worker, added by other
// test files' init functions (wait_helpers_test.go): each gets the child's
// crash mode and effects URL and may set crash points in cfg's hooks.
var childExtras []func(crash, effectsURL string, cfg *WorkerConfig) []Registrable

// childrenReady maps a child's *exec.Cmd to a channel closed once its
// worker has started.
var childrenReady sync.Map

// waitReady waits until the child's worker has started (it prints
// childReady), as a rolling update waits for a new pod's readiness.
func waitReady(cmd *exec.Cmd, d time.Duration) error {
	ch, ok := childrenReady.Load(cmd)
	if !ok {
		return fmt.Errorf("not a child worker")
	}
	select {
	case <-ch.(chan struct{}):
		return nil
	case <-time.After(d):
		return fmt.Errorf("child worker not started within %s", d)
	}
}

// waitKilled waits for a child to die by SIGKILL.
func waitKilled(t *testing.T, cmd *exec.Cmd, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ok)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child exited with %v, want SIGKILL", cmd.ProcessState)
	case <-time.After(d):
		t.Fatalf("child worker did not crash within %s", d)
	}
}
