package inspector_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/inspector"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// requestTimeout bounds each request of the page on the server (the API's
// and the inspector's Config.RequestTimeout), and pageRefresh is how often
// the page reads the run or the list again (app.js, REFRESH_MS): the
// browser tests' waits derive from them (waitTimeout).
const (
	requestTimeout = 10 * time.Second
	pageRefresh    = 3 * time.Second
)

// flakyFailures is how often the "flaky" workflow's charge step fails
// before it succeeds.
const flakyFailures = 2

// env is one test's embedded NATS server, worker, client, and the API and
// inspector mounted on one mux as producer serve mounts them.
type env struct {
	t      *testing.T
	client *jetflow.Client
	srv    *httptest.Server
	mu     sync.Mutex
	tries  map[string]int   // charge attempts by run ID
	holds  map[string]*hold // requests held, by method and path ("POST /v1/...")
}

// hold is what happens to the requests of one method and path that the
// test holds: each waits until decided is closed, then pass serves it, or
// cuts its connection without an answer.
type hold struct {
	arrived chan struct{} // closed when the first one arrives
	decided chan struct{} // closed by the decision
	once    sync.Once     // closes arrived
	pass    bool          // written before decided is closed
}

// echoIn is the input of "echo" and "fails": any JSON object.
type echoIn map[string]any

// newEnv starts the server, a worker serving the test workflows, and
// producer serve's handler (httpapi + inspector) with tokens (none: open).
//
// Workflows: "echo" returns its input from a step; "fails" fails at once;
// "flaky" runs a charge step that fails flakyFailures times before it
// succeeds (then a receipt step with a run-scoped task key, and a short
// sleep); "stuck" runs a step that fails and waits an hour for its
// retry; "waiter" waits for the event "go" (an hour).
func newEnv(t *testing.T, tokens ...string) *env {
	t.Helper()
	e := &env{t: t, tries: map[string]int{}, holds: map[string]*hold{}}
	ns := testenv.Server(t)
	ws := jetflow.NewWorkers()
	require.NoError(t, ws.Add(
		jetflow.NewWorkflow("echo", func(ctx *jetflow.Context, in echoIn) (echoIn, error) {
			return jetflow.Step(ctx, "copy", func(context.Context) (echoIn, error) { return in, nil })
		}),
		jetflow.NewWorkflow("fails", func(*jetflow.Context, echoIn) (int, error) {
			return 0, errors.New("the card was declined")
		}),
		jetflow.NewWorkflow("flaky", func(ctx *jetflow.Context, in echoIn) (string, error) {
			charge, err := jetflow.Step(ctx, "charge", func(context.Context) (string, error) {
				e.mu.Lock()
				defer e.mu.Unlock()
				e.tries[ctx.RunID()]++
				if n := e.tries[ctx.RunID()]; n <= flakyFailures {
					return "", fmt.Errorf("payment service timed out (attempt %d)", n)
				}
				return "ch_1", nil
			}, jetflow.WithBackoff(20*time.Millisecond, 50*time.Millisecond))
			if err != nil {
				return "", err
			}
			if _, err := jetflow.Step(ctx, "receipt", func(context.Context) (bool, error) { return true, nil },
				jetflow.WithTaskKey("receipt-"+charge, time.Hour)); err != nil {
				return "", err
			}
			if err := jetflow.Sleep(ctx, "settle", 30*time.Millisecond); err != nil {
				return "", err
			}
			return charge, nil
		}),
		jetflow.NewWorkflow("stuck", func(ctx *jetflow.Context, in echoIn) (int, error) {
			return jetflow.Step(ctx, "call", func(context.Context) (int, error) {
				return 0, errors.New("the partner API answers 502")
			}, jetflow.WithBackoff(time.Hour, time.Hour))
		}),
		jetflow.NewWorkflow("waiter", func(ctx *jetflow.Context, in echoIn) (string, error) {
			return jetflow.WaitEvent[string](ctx, "go", jetflow.WithTimeout(time.Hour))
		}, jetflow.WithEvent[string]("go")),
	))
	w, err := jetflow.NewWorker(testenv.Conn(t, ns), ws, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctxT(t, 30*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	e.client, err = jetflow.NewClient(ctxT(t, 10*time.Second), testenv.Conn(t, ns), jetflow.ClientConfig{})
	require.NoError(t, err)

	api, err := httpapi.New(httpapi.Config{Backend: e.client, Tokens: tokens, RequestTimeout: requestTimeout, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ui, err := inspector.New(inspector.Config{Backend: e.client, Tokens: tokens, RequestTimeout: requestTimeout, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	inspector.Register(mux, ui)
	e.srv = httptest.NewServer(e.holding(mux))
	t.Cleanup(e.srv.Close)
	return e
}

// hold makes the requests method path (the path as the server sees it)
// wait until the test decides: it returns a channel closed when the first
// one arrives, and decide, which serves the held requests and every later
// one (pass) or cuts their connections without an answer, as a network
// failure would. decide is called once.
func (e *env) hold(method, path string) (arrived <-chan struct{}, decide func(pass bool)) {
	h := &hold{arrived: make(chan struct{}), decided: make(chan struct{})}
	e.mu.Lock()
	e.holds[method+" "+path] = h
	e.mu.Unlock()
	return h.arrived, func(pass bool) {
		h.pass = pass
		close(h.decided)
	}
}

// unhold serves the requests method path again, from now on.
func (e *env) unhold(method, path string) {
	e.mu.Lock()
	delete(e.holds, method+" "+path)
	e.mu.Unlock()
}

// arrives waits, within waitTimeout, until arrived (of hold) is closed.
func (e *env) arrives(arrived <-chan struct{}, what string) {
	e.t.Helper()
	select {
	case <-arrived:
	case <-time.After(waitTimeout):
		e.t.Fatalf("%s did not arrive at the server within %v", what, waitTimeout)
	}
}

// requireRun reads runID through the client and requires its status and
// generation; it returns the run.
func (e *env) requireRun(runID string, status jetflow.RunStatus, generation int, msg string) jetflow.Run {
	e.t.Helper()
	run, err := e.client.GetRun(ctxT(e.t, requestTimeout), runID)
	require.NoError(e.t, err, msg)
	require.Equal(e.t, status, run.Status, msg)
	require.Equal(e.t, generation, run.Generation, msg)
	return run
}

// holding serves next, except the requests held by hold.
func (e *env) holding(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		h := e.holds[r.Method+" "+r.URL.Path]
		e.mu.Unlock()
		if h == nil {
			next.ServeHTTP(w, r)
			return
		}
		h.once.Do(func() { close(h.arrived) })
		select {
		case <-h.decided:
		case <-r.Context().Done():
			return
		}
		if h.pass {
			next.ServeHTTP(w, r)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			e.t.Errorf("cutting the held request %s %s: %v", r.Method, r.URL.Path, err)
			return
		}
		if err := conn.Close(); err != nil {
			e.t.Errorf("cutting the held request %s %s: %v", r.Method, r.URL.Path, err)
		}
	})
}

// start starts workflow with input under runID (and opts) and returns its
// result.
func (e *env) start(workflow, runID string, input any, opts ...jetflow.StartOption) jetflow.StartResult {
	e.t.Helper()
	b, err := json.Marshal(input)
	require.NoError(e.t, err)
	opts = append([]jetflow.StartOption{jetflow.WithRunID(runID), jetflow.WithSource("test")}, opts...)
	res, err := e.client.StartByName(ctxT(e.t, 20*time.Second), workflow, b, opts...)
	require.NoError(e.t, err)
	return res
}

// wait waits for runID to end and returns it.
func (e *env) wait(runID string) jetflow.Run {
	e.t.Helper()
	run, err := e.client.WaitRun(ctxT(e.t, 30*time.Second), runID)
	require.NoError(e.t, err)
	return run
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
