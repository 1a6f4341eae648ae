// Package inspectortest runs the web inspector as producer serve mounts
// it, beside the HTTP API, over a real embedded NATS server and a worker
// serving a few test workflows, for the inspector's tests: its HTTP tests
// (internal/server/inspector) and its browser tests, which are in the
// checks module with chromedp (checks/inspector).
package inspectortest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/inspector"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// RequestTimeout bounds each request of the page on the server (the API's
// and the inspector's Config.RequestTimeout), and PageRefresh is how often
// the page reads the run or the list again (app.js, REFRESH_MS): the
// browser tests' waits derive from them (checks/inspector, waitTimeout).
const (
	RequestTimeout = 10 * time.Second
	PageRefresh    = 3 * time.Second
)

// FlakyFailures is how often the "flaky" workflow's charge step fails
// before it succeeds.
const FlakyFailures = 2

// Env is one test's embedded NATS server, worker, client, and the API and
// inspector mounted on one mux as producer serve mounts them.
type Env struct {
	T      *testing.T
	Client *jetflow.Client
	Srv    *httptest.Server // the API on /v1/, the inspector on /ui/
	// WorkerName is the name of the worker New starts.
	WorkerName string
	// Signup is the code of blocktest's workflow, which the worker serves
	// (Block blocks a run of it).
	Signup *blocktest.Code
	ns     *natsserver.Server
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

// EchoIn is the input of "echo" and "fails": any JSON object.
type EchoIn map[string]any

// New starts the server, a worker serving the test workflows, and
// producer serve's handler (httpapi + inspector) with tokens (none: open).
//
// Workflows: "echo" returns its input from a step; "fails" fails at once;
// "flaky" runs a charge step that fails FlakyFailures times before it
// succeeds (then a receipt step with a run-scoped task key, and a short
// sleep); "stuck" runs a step that fails and waits an hour for its
// retry; "waiter" waits for the event "go" (an hour); "verify" waits
// 50ms for the event "verified", then sends a reminder; the
// waitWorkflows; and blocktest's "signup" (Env.Signup, Env.Block). Its
// workers' build is blocktest.Build.
func New(t *testing.T, tokens ...string) *Env {
	t.Helper()
	e := &Env{T: t, tries: map[string]int{}, holds: map[string]*hold{}, Signup: blocktest.New()}
	ns := testenv.Server(t)
	e.ns = ns
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(
		jetflow.NewWorkflow("echo", func(ctx *jetflow.Context, in EchoIn) (EchoIn, error) {
			return jetflow.Step(ctx, "copy", func(context.Context) (EchoIn, error) { return in, nil })
		}),
		jetflow.NewWorkflow("fails", func(*jetflow.Context, EchoIn) (int, error) {
			return 0, errors.New("the card was declined")
		}),
		jetflow.NewWorkflow("flaky", func(ctx *jetflow.Context, in EchoIn) (string, error) {
			charge, err := jetflow.Step(ctx, "charge", func(context.Context) (string, error) {
				e.mu.Lock()
				defer e.mu.Unlock()
				e.tries[ctx.RunID()]++
				if n := e.tries[ctx.RunID()]; n <= FlakyFailures {
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
		jetflow.NewWorkflow("stuck", func(ctx *jetflow.Context, in EchoIn) (int, error) {
			return jetflow.Step(ctx, "call", func(context.Context) (int, error) {
				return 0, errors.New("the partner API answers 502")
			}, jetflow.WithBackoff(time.Hour, time.Hour))
		}),
		jetflow.NewWorkflow("waiter", func(ctx *jetflow.Context, in EchoIn) (string, error) {
			return jetflow.WaitEvent[string](ctx, "go", jetflow.WithTimeout(time.Hour))
		}, jetflow.WithEvent[string]("go")),
		jetflow.NewWorkflow("verify", func(ctx *jetflow.Context, in EchoIn) (string, error) {
			if _, err := jetflow.WaitEvent[string](ctx, "verified", jetflow.WithTimeout(50*time.Millisecond)); err == nil {
				return "verified", nil
			}
			return jetflow.Step(ctx, "send-reminder", func(context.Context) (string, error) { return "reminded", nil })
		}, jetflow.WithEvent[string]("verified")),
	))
	require.NoError(t, ws.Register(waitWorkflows()...))
	require.NoError(t, ws.Register(e.Signup.Workflow()))
	e.WorkerName = "inspector-test-worker"
	e.Worker(e.WorkerName, ws)
	var err error
	e.Client, err = jetflow.NewClient(ctxT(t, 10*time.Second), testenv.Conn(t, ns), jetflow.ClientConfig{})
	require.NoError(t, err)

	api, err := httpapi.New(httpapi.Config{Backend: e.Client, Tokens: tokens, RequestTimeout: RequestTimeout, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	ui, err := inspector.New(inspector.Config{Backend: e.Client, Tokens: tokens, RequestTimeout: RequestTimeout, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	inspector.Register(mux, ui)
	e.Srv = httptest.NewServer(e.holding(mux))
	t.Cleanup(e.Srv.Close)
	return e
}

// Waits of the wait workflows (waitWorkflows).
const (
	SleepFor      = time.Hour      // "sleeper"'s cool-off
	PaymentWithin = 24 * time.Hour // "payment"'s wait for the event "paid"
)

// waitWorkflows are the workflows whose runs wait, and one whose step fails
// for good:
//
//   - "sleeper" reserves (a step whose output is its input and a
//     "reservation") and sleeps SleepFor ("cool-off");
//   - "payment" invoices and waits for the event "paid" (a JSON object)
//     for PaymentWithin;
//   - "approval" waits, without a deadline, for the hook token
//     "approve-<input's order>" (the event "approved");
//   - "parent" starts "hold" as its child run <run ID>-child and waits for
//     it to end; "hold" waits for the event "release", without a deadline;
//   - "exhausts" runs a step that fails on each of its 2 attempts, so the
//     run fails.
func waitWorkflows() []jetflow.Registrable {
	hold := jetflow.NewWorkflow("hold", func(ctx *jetflow.Context, in EchoIn) (string, error) {
		return jetflow.WaitEvent[string](ctx, "release")
	}, jetflow.WithEvent[string]("release"))
	return []jetflow.Registrable{
		hold,
		jetflow.NewWorkflow("sleeper", func(ctx *jetflow.Context, in EchoIn) (string, error) {
			if _, err := jetflow.Step(ctx, "reserve", func(context.Context) (EchoIn, error) {
				out := EchoIn{"reservation": "r-88"}
				maps.Copy(out, in)
				return out, nil
			}); err != nil {
				return "", err
			}
			return "cooled", jetflow.Sleep(ctx, "cool-off", SleepFor)
		}),
		jetflow.NewWorkflow("payment", func(ctx *jetflow.Context, in EchoIn) (EchoIn, error) {
			if _, err := jetflow.Step(ctx, "invoice", func(context.Context) (string, error) { return "inv-" + ctx.RunID(), nil }); err != nil {
				return nil, err
			}
			return jetflow.WaitEvent[EchoIn](ctx, "paid", jetflow.WithTimeout(PaymentWithin))
		}, jetflow.WithEvent[EchoIn]("paid")),
		jetflow.NewWorkflow("approval", func(ctx *jetflow.Context, in EchoIn) (EchoIn, error) {
			return jetflow.WaitEvent[EchoIn](ctx, "approved", jetflow.WithHookToken(fmt.Sprint("approve-", in["order"])))
		}, jetflow.WithEvent[EchoIn]("approved")),
		jetflow.NewWorkflow("parent", func(ctx *jetflow.Context, in EchoIn) (string, error) {
			return jetflow.Child(ctx, hold, in, jetflow.WithChildRunID(ctx.RunID()+"-child")).Get(ctx)
		}),
		jetflow.NewWorkflow("exhausts", func(ctx *jetflow.Context, in EchoIn) (int, error) {
			return jetflow.Step(ctx, "call", func(context.Context) (int, error) {
				return 0, errors.New("the partner API answers 503")
			}, jetflow.WithMaxAttempts(2), jetflow.WithBackoff(20*time.Millisecond, 50*time.Millisecond))
		}),
	}
}

// Worker starts a worker called name serving ws, on its own connection;
// it is stopped when the test ends (a Stop before that is the test's).
func (e *Env) Worker(name string, ws *jetflow.Registry) *jetflow.Worker {
	e.T.Helper()
	w, err := jetflow.NewWorker(testenv.Conn(e.T, e.ns), ws, jetflow.WorkerConfig{Name: name, Build: blocktest.Build, Logger: testenv.Logger(e.T)})
	require.NoError(e.T, err)
	require.NoError(e.T, w.Start(ctxT(e.T, 30*time.Second)))
	e.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(e.T, w.Stop(ctx), "stopping worker %s", name) // a second Stop does nothing
	})
	return w
}

// Hold makes the requests method path (the path as the server sees it)
// wait until the test decides: it returns a channel closed when the first
// one arrives, and decide, which serves the held requests and every later
// one (pass) or cuts their connections without an answer, as a network
// failure would. decide is called once.
func (e *Env) Hold(method, path string) (arrived <-chan struct{}, decide func(pass bool)) {
	h := &hold{arrived: make(chan struct{}), decided: make(chan struct{})}
	e.mu.Lock()
	e.holds[method+" "+path] = h
	e.mu.Unlock()
	return h.arrived, func(pass bool) {
		h.pass = pass
		close(h.decided)
	}
}

// Unhold serves the requests method path again, from now on.
func (e *Env) Unhold(method, path string) {
	e.mu.Lock()
	delete(e.holds, method+" "+path)
	e.mu.Unlock()
}

// Arrives waits, within d, until arrived (of Hold) is closed.
func (e *Env) Arrives(arrived <-chan struct{}, what string, d time.Duration) {
	e.T.Helper()
	select {
	case <-arrived:
	case <-time.After(d):
		e.T.Fatalf("%s did not arrive at the server within %v", what, d)
	}
}

// RequireRun reads runID through the client and requires its status and
// generation; it returns the run.
func (e *Env) RequireRun(runID string, status jetflow.RunStatus, generation int, msg string) jetflow.Run {
	e.T.Helper()
	run, err := e.Client.GetRun(ctxT(e.T, RequestTimeout), runID)
	require.NoError(e.T, err, msg)
	require.Equal(e.T, status, run.Status, msg)
	require.Equal(e.T, generation, run.Generation, msg)
	return run
}

// holding serves next, except the requests held by Hold.
func (e *Env) holding(next http.Handler) http.Handler {
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
			e.T.Errorf("cutting the held request %s %s: %v", r.Method, r.URL.Path, err)
			return
		}
		if err := conn.Close(); err != nil {
			e.T.Errorf("cutting the held request %s %s: %v", r.Method, r.URL.Path, err)
		}
	})
}

// Start starts workflow with input under runID (and opts) and returns its
// result.
func (e *Env) Start(workflow, runID string, input any, opts ...jetflow.StartOption) jetflow.StartResult {
	e.T.Helper()
	b, err := json.Marshal(input)
	require.NoError(e.T, err)
	opts = append([]jetflow.StartOption{jetflow.WithRunID(runID), jetflow.WithSource("test")}, opts...)
	res, err := e.Client.StartByName(ctxT(e.T, 20*time.Second), workflow, b, opts...)
	require.NoError(e.T, err)
	return res
}

// Block blocks a run of "signup" under runID (blocktest.Code.Block) and
// returns it.
func (e *Env) Block(runID string) jetflow.Run {
	e.T.Helper()
	return e.Signup.Block(e.T, e.Client, runID)
}

// Wait waits for runID to end and returns it.
func (e *Env) Wait(runID string) jetflow.Run {
	e.T.Helper()
	run, err := e.Client.WaitRun(ctxT(e.T, 30*time.Second), runID)
	require.NoError(e.T, err)
	return run
}

// ctxT is a context that ends after d or with t.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Answer is one HTTP answer, read in full.
type Answer struct {
	Code   int
	Header http.Header
	Body   string
}

// Send sends a request to the env's server without following redirects.
func (e *Env) Send(method, path string, header http.Header, body string) Answer {
	e.T.Helper()
	req, err := http.NewRequestWithContext(ctxT(e.T, 30*time.Second), method, e.Srv.URL+path, strings.NewReader(body))
	require.NoError(e.T, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Do(req)
	require.NoError(e.T, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.T, err)
	return Answer{res.StatusCode, res.Header, string(b)}
}
