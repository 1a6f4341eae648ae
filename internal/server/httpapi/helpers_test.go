package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/natsserver"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/testsupport/blocktest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// echoIn is the input of the test workflows.
type echoIn struct {
	N     int  `json:"n"`
	Block bool `json:"block,omitempty"`
}

// waiterIn is the input of the "waiter" workflow: a hook token to wait
// on ("" waits by run and name), and whether to block before the wait.
type waiterIn struct {
	Token string `json:"token,omitempty"`
	Block bool   `json:"block,omitempty"`
	// HoldAfter blocks after the wait, until release.
	HoldAfter bool `json:"hold_after,omitempty"`
}

// payment is the payload of the "paid" event.
type payment struct {
	Ref   string `json:"ref"`
	Cents int    `json:"cents"`
}

// Webhook test sources: one per provider, each starting "hook".
var (
	standardSecret = "whsec_" + "dGVzdC1zZWNyZXQtc3RhbmRhcmQtMDEyMzQ1Njc4OQ=="
	githubSecret   = "gh-test-secret"
	stripeSecret   = "whsec_stripe_test_secret"
	testSources    = []webhook.Source{
		{Name: "std", Provider: webhook.Standard, Workflow: "hook", Secrets: []string{standardSecret}},
		{Name: "gh", Provider: webhook.GitHub, Workflow: "hook", Secrets: []string{githubSecret}},
		{Name: "stripe", Provider: webhook.Stripe, Workflow: "hook", Secrets: []string{stripeSecret}},
	}
	// testNow is the webhook clock of every test server.
	testNow = time.Unix(1_700_000_000, 0).UTC()
)

// bundle is one test's embedded NATS server, worker, client and API.
type bundle struct {
	t *testing.T
	// ns is the embedded NATS server, for tests that stop and restart it.
	ns     *natsserver.Server
	client *jetflow.Client
	srv    *httptest.Server
	// release lets every blocked run finish (idempotent).
	release func()
	// sends counts the runs of the "mailer" step.
	sends atomic.Int64
	// afters counts the runs of the "waiter" step that follows its wait.
	afters atomic.Int64
	// observed collects what Config.Observe was told.
	mu       sync.Mutex
	observed []observation
	// observedCh receives each observation as it is made.
	observedCh chan observation
	// signup is the code of blocktest's workflow, which Block changes
	// under a run to block it.
	signup *blocktest.Code
}

type observation struct {
	route string
	code  int
}

// setup starts an embedded NATS server, a worker serving the test
// workflows, and the API on an httptest server; edit changes the API's
// config. Everything stops when t ends.
//
// Workflows: "echo" (echoIn -> n*2 via one step; blocks until release
// when Block), "reject" (as echo, but a duplicate while running is
// rejected), "keyed" (as echo, requires an Idempotency-Key), "strict"
// (as echo, refuses an input with fields echoIn does not declare), "fails"
// (fails at once), "hook" (any JSON, for webhooks; StartNew after it
// ended), "mailer" (a step with the global task key given as input,
// counted in sends) and "waiter" (waits for the event "paid", a payment,
// by run and name or on the hook token of its input, then returns the
// payment's ref from a step counted in afters; with Block a step blocks
// until release before the wait, with HoldAfter after it), "flaky" (its
// step "charge" fails its first two attempts with "declined: " and the
// input string, then returns the input; retried after 10ms; with the
// input "hold" a step "prepare" comes first, so that "charge" runs as a
// task of its own, and its third attempt blocks until release), and
// blocktest's "signup" (b.signup; the worker's build is blocktest.Build).
func setup(t *testing.T, edit ...func(*Config)) *bundle {
	t.Helper()
	requireContract(t) // loaded here, on the test's goroutine: observe reads it
	b := &bundle{t: t, observedCh: make(chan observation, 256), signup: blocktest.New()}
	ns := testenv.Server(t)
	b.ns = ns
	gate := make(chan struct{})
	var once sync.Once
	b.release = func() { once.Do(func() { close(gate) }) }

	echo := func(ctx *jetflow.Context, in echoIn) (int, error) {
		return jetflow.Step(ctx, "double", func(ctx context.Context) (int, error) {
			if in.Block {
				select {
				case <-gate:
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			return in.N * 2, nil
		})
	}
	// hold is a step that runs until release.
	hold := func(ctx *jetflow.Context, name string) error {
		_, err := jetflow.Step(ctx, name, func(sctx context.Context) (bool, error) {
			select {
			case <-gate:
				return true, nil
			case <-sctx.Done():
				return false, sctx.Err()
			}
		})
		return err
	}
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(
		jetflow.NewWorkflow("echo", echo),
		jetflow.NewWorkflow("reject", echo, jetflow.WithDefaultConflictPolicy(jetflow.ConflictPolicy{WhileRunning: jetflow.RejectWhileRunning})),
		jetflow.NewWorkflow("keyed", echo, jetflow.RequireRunID()),
		jetflow.NewWorkflow("strict", echo, jetflow.WithStrictInput()),
		jetflow.NewWorkflow("fails", func(*jetflow.Context, echoIn) (int, error) { return 0, errors.New("it failed") }),
		// A hook run ID started again after its run ended would start a new
		// run, but for webhooks, whose redeliveries must land on the run.
		jetflow.NewWorkflow("hook", func(*jetflow.Context, json.RawMessage) (bool, error) { return true, nil },
			jetflow.WithDefaultConflictPolicy(jetflow.ConflictPolicy{AfterCompleted: jetflow.StartNew, AfterFailed: jetflow.StartNew})),
		jetflow.NewWorkflow("mailer", func(ctx *jetflow.Context, key string) (int64, error) {
			return jetflow.Step(ctx, "send", func(context.Context) (int64, error) { return b.sends.Add(1), nil },
				jetflow.WithTaskKey(key, time.Hour), jetflow.WithKeyScope(jetflow.ScopeGlobal))
		}),
		jetflow.NewWorkflow("flaky", func(ctx *jetflow.Context, msg string) (string, error) {
			if msg == "hold" {
				if _, err := jetflow.Step(ctx, "prepare", func(context.Context) (bool, error) { return true, nil }); err != nil {
					return "", err
				}
			}
			return jetflow.Step(ctx, "charge", func(sctx context.Context) (string, error) {
				if d, _ := jetflow.StepDetailsFrom(sctx); d.Attempt < 3 {
					return "", errors.New("declined: " + msg)
				}
				if msg == "hold" {
					select {
					case <-gate:
					case <-sctx.Done():
						return "", sctx.Err()
					}
				}
				return msg, nil
			}, jetflow.WithBackoff(10*time.Millisecond, 10*time.Millisecond))
		}),
		jetflow.NewWorkflow("waiter", func(ctx *jetflow.Context, in waiterIn) (string, error) {
			if in.Block {
				if err := hold(ctx, "hold"); err != nil {
					return "", err
				}
			}
			var opts []jetflow.WaitOption
			if in.Token != "" {
				opts = append(opts, jetflow.WithHookToken(in.Token))
			}
			p, err := jetflow.WaitEvent[payment](ctx, "paid", opts...)
			if err != nil {
				return "", err
			}
			if in.HoldAfter {
				if err := hold(ctx, "hold-after"); err != nil {
					return "", err
				}
			}
			return jetflow.Step(ctx, "after", func(context.Context) (string, error) { b.afters.Add(1); return p.Ref, nil })
		}, jetflow.WithEvent[payment]("paid")),
		b.signup.Workflow(),
	))
	runWorker(t, ns, ws, jetflow.WorkerConfig{Build: blocktest.Build})
	t.Cleanup(b.release) // runs before the worker stops: blocked steps finish

	var err error
	b.client, err = jetflow.NewClient(ctxT(t, 10*time.Second), testenv.Conn(t, ns), jetflow.ClientConfig{})
	require.NoError(t, err)
	cfg := Config{
		Backend: b.client,
		Sources: testSources,
		Now:     func() time.Time { return testNow },
		Logger:  testenv.Logger(t),
		Observe: b.observe,
	}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)
	return b
}

// observe records an observation and checks that it names a route of the
// table (never a raw path) and a status code openapi.yaml documents for it.
func (b *bundle) observe(route string, code int, _ time.Duration) {
	b.mu.Lock()
	b.observed = append(b.observed, observation{route, code})
	b.mu.Unlock()
	select {
	case b.observedCh <- observation{route, code}:
	default:
	}
	if route == unmatched || code == statusClientClosed {
		return
	}
	codes, ok := documentedCodes(b.t)[route]
	if !ok {
		b.t.Errorf("Observe got route %q, which is not in the route table", route)
		return
	}
	if !codes[fmt.Sprint(code)] {
		b.t.Errorf("route %s answered %d, which openapi.yaml does not document", route, code)
	}
}

// response is an answer read in full.
type response struct {
	code   int
	header http.Header
	body   []byte
}

// json decodes the body into v.
func (r response) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

// problem decodes a problem body, checking its content type and status.
func (r response) problem(t *testing.T) Problem {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var p Problem
	r.json(t, &p)
	require.Equal(t, r.code, p.Status)
	require.NotEmpty(t, p.Title)
	require.NotEmpty(t, p.Type)
	return p
}

// do sends a request to the API; header holds extra headers (a nil value
// deletes one), body is sent as is.
func (b *bundle) do(method, path string, header http.Header, body string) response {
	b.t.Helper()
	return doCtx(b.t, ctxT(b.t, 30*time.Second), b.srv, method, path, header, body)
}

// doCtx sends a request to srv and reads the answer, which must conform
// to openapi.yaml (contractClient).
func doCtx(t *testing.T, ctx context.Context, srv *httptest.Server, method, path string, header http.Header, body string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, rd)
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	res, err := contractClient(t, srv).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{code: res.StatusCode, header: res.Header, body: data}
}

// post starts a run of workflow with input under key ("" for none).
func (b *bundle) post(workflow, key, input string) response {
	b.t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set(HeaderIdempotencyKey, key)
	}
	return b.do(http.MethodPost, "/v1/workflows/"+workflow+"/runs", h, input)
}

// waitDone waits until the run has ended, through the API: one long poll
// of the API's longest wait (a run resumed after a NATS restart, on a
// loaded machine, can take its workers' reconnection and backoff first).
func (b *bundle) waitDone(runID string) response {
	b.t.Helper()
	res := doCtx(b.t, ctxT(b.t, MaxWait+10*time.Second), b.srv, http.MethodGet,
		"/v1/runs/"+runID+"/result?wait="+MaxWait.String(), nil, "")
	require.Equal(b.t, http.StatusOK, res.code, "body: %s", res.body)
	return res
}

// ctxT is a context bounded by d and by the test's end.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// runWorker starts a worker of ws on its own connection to ns (cfg's
// Logger is the test's), stopped when t ends.
func runWorker(t *testing.T, ns *natsserver.Server, ws *jetflow.Registry, cfg jetflow.WorkerConfig) {
	t.Helper()
	cfg.Logger = testenv.Logger(t)
	w, err := jetflow.NewWorker(testenv.Conn(t, ns), ws, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(ctxT(t, 30*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
}
