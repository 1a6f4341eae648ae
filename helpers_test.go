package jetflow

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChildWorker())
	}
	testenv.VerifyNoLeaks(m)
}

// testEnv is one test's embedded server and topology.
type testEnv struct {
	t    *testing.T
	srv  *natsserver.Server
	topo Topology
}

// newEnv starts an embedded nats-server with its own store directory and a
// free port, shut down when the test ends.
func newEnv(t *testing.T, topo Topology) *testEnv {
	t.Helper()
	return &testEnv{t: t, srv: testenv.Server(t), topo: topo}
}

func (e *testEnv) conn() *nats.Conn {
	e.t.Helper()
	return testenv.Conn(e.t, e.srv)
}

func (e *testEnv) client() *Client {
	e.t.Helper()
	c, err := NewClient(ctxT(e.t, 10*time.Second), e.conn(), ClientConfig{Topology: e.topo})
	require.NoError(e.t, err)
	return c
}

// worker starts a worker serving wfs, stopped when the test ends.
func (e *testEnv) worker(cfg WorkerConfig, wfs ...Registrable) *Worker {
	e.t.Helper()
	cfg.Topology = e.topo
	w := startWorker(e.t, e.conn(), cfg, wfs...)
	stopAtEnd(e.t, w, 10*time.Second)
	return w
}

// startWorker starts a worker on nc serving wfs; the caller stops it. A
// config without a logger logs warnings to the test.
func startWorker(t *testing.T, nc *nats.Conn, cfg WorkerConfig, wfs ...Registrable) *Worker {
	t.Helper()
	ws := NewRegistry()
	require.NoError(t, ws.Register(wfs...))
	if cfg.Logger.GetLevel() == zerolog.DebugLevel { // the zero Logger
		cfg.Logger = testenv.Logger(t)
	}
	w, err := NewWorker(nc, ws, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctxT(t, 30*time.Second)))
	return w
}

// stopAtEnd stops w when t ends and fails t if the drain takes over d.
func stopAtEnd(t *testing.T, w *Worker, d time.Duration) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
}

// ctxT is a context bounded by d and by the test's end.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// counter counts side effects by key, as an external system would.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: make(map[string]int)} }

func (c *counter) inc(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[key]++
	return c.n[key]
}

func (c *counter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// threeSteps is a workflow of three steps, each recording its side effect
// under its step ID in sideEffects.
func threeSteps(name string, sideEffects *counter) *Workflow[int, int] {
	return NewWorkflow(name, func(ctx *Context, in int) (int, error) {
		sum := in
		for _, step := range []string{"a", "b", "c"} {
			v, err := Step(ctx, step, func(sctx context.Context) (int, error) {
				info, ok := StepDetailsFrom(sctx)
				if !ok {
					return 0, fmt.Errorf("no step info")
				}
				sideEffects.inc(info.StepID)
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

// churn calls start with 0, 1, 2, ... on a goroutine of its own until
// start returns false or the returned stop is called; stop waits for it.
func churn(start func(i int) bool) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			if !start(i) {
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}
