// Package httpapi is jetflow's HTTP API, served by `producer serve`: it
// starts runs under an Idempotency-Key (the IETF httpapi draft's semantics,
// with the key as the run ID), reads, waits for, lists, cancels, unblocks
// and reruns runs, resets task
// idempotency keys (DELETE /v1/task-keys/{key}), delivers events to
// runs and hooks (the event ID in the Idempotency-Key) and takes webhook
// deliveries. docs/http.md describes it for users and openapi.yaml is its
// contract; one route table (routes) registers the handlers and is checked
// against that document.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
	"github.com/jetflow/jetflow/internal/server/webhook"
	"github.com/jetflow/jetflow/internal/state"
)

// Backend is what the API needs of jetflow; *jetflow.Client satisfies it.
type Backend interface {
	StartByName(ctx context.Context, name string, input json.RawMessage, opts ...jetflow.StartOption) (jetflow.StartResult, error)
	GetRun(ctx context.Context, runID string) (jetflow.Run, error)
	Describe(ctx context.Context, runID string) (jetflow.RunDescription, error)
	WaitRun(ctx context.Context, runID string) (jetflow.Run, error)
	ListRuns(ctx context.Context, opts jetflow.ListOptions) (jetflow.RunPage, error)
	CountRuns(ctx context.Context, workflow string) (jetflow.RunCounts, error)
	ResetTaskKey(ctx context.Context, key string, scope jetflow.KeyScope, scopeID string) (int, error)
	CancelRun(ctx context.Context, runID string) (jetflow.CancelOutcome, error)
	UnblockRun(ctx context.Context, runID string, opts jetflow.UnblockOptions) (jetflow.UnblockOutcome, error)
	Rerun(ctx context.Context, runID string, opts jetflow.RerunOptions) (jetflow.RerunResult, error)
	SendEvent(ctx context.Context, runID, name, eventID string, payload json.RawMessage) (jetflow.EventResult, error)
	Resume(ctx context.Context, token, eventID string, payload json.RawMessage) (jetflow.EventResult, error)
	Roster(ctx context.Context) (jetflow.Roster, error)
	EngineStatus(ctx context.Context) (jetflow.EngineStatus, error)
}

// Limits of the API.
const (
	// MaxWait is the longest long-poll of GET /v1/runs/{id}/result.
	MaxWait = 60 * time.Second
	// DefaultRequestTimeout bounds a start or a read when
	// Config.RequestTimeout is zero.
	DefaultRequestTimeout = 10 * time.Second
	// MaxBodyBytes is the largest request body: the SDK's input limit.
	MaxBodyBytes = state.MaxInputBytes
)

// Config configures a Server.
type Config struct {
	// Backend starts and reads runs (required).
	Backend Backend
	// Tokens, when not empty, are the bearer tokens accepted on every /v1
	// route except webhooks and the OpenAPI document; a request without
	// one of them gets 401. Surrounding white space is ignored. Empty: no
	// authentication. The web inspector's cookie (token.CookieName) counts
	// as a token only on a request that also carries X-Jetflow-UI: 1,
	// which a cross-site form cannot send.
	Tokens []string
	// Sources are the webhook sources, by the {source} of
	// POST /v1/webhooks/{source}. Names must be unique.
	Sources []webhook.Source
	// RequestTimeout bounds each start and read against NATS (default
	// DefaultRequestTimeout). A long-poll waits up to its own wait on top.
	RequestTimeout time.Duration
	// Observe, if set, is called once per request when it has been
	// answered, with the route pattern of the route table ("POST
	// /v1/workflows/{name}/runs"; "unmatched" for a request no route
	// matches, never the raw path), the status code and the duration.
	Observe func(route string, code int, d time.Duration)
	// Now is the clock webhook timestamps are checked against (default
	// time.Now).
	Now func() time.Time
	// Logger receives server-side failures (5xx); it never receives
	// tokens, secrets or payloads. The zero value discards.
	Logger zerolog.Logger
	// Stopping, if set, ends when the server begins to shut down: long
	// polls then answer at once with the run as it is (202 while it
	// runs), so that a graceful shutdown need not wait out their waits.
	Stopping context.Context
}

// Server is the HTTP API. It is an http.Handler, safe for concurrent use.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	tokens  *token.Set
	sources map[string]webhook.Source
	log     zerolog.Logger
	// maxBody is MaxBodyBytes; tests lower it.
	maxBody int64
}

// route is one entry of the route table.
type route struct {
	method string
	path   string
	// public routes need no bearer token (they authenticate otherwise, or
	// need nothing).
	public bool
	// deprecated routes answer with a "Deprecation: true" header (and are
	// marked deprecated in openapi.yaml): old names kept as aliases.
	deprecated bool
	handle     func(*Server, http.ResponseWriter, *http.Request)
}

// pattern is the route's http.ServeMux pattern, as Observe reports it.
func (rt route) pattern() string { return rt.method + " " + rt.path }

// routes is the single list of the API's routes: New registers exactly
// these, and the OpenAPI test requires openapi.yaml to document exactly
// these.
var routes = []route{
	{method: http.MethodPost, path: pathStart, handle: (*Server).start},
	{method: http.MethodGet, path: "/v1/runs", handle: (*Server).listRuns},
	// A literal segment is more specific than {id}, so ServeMux routes
	// /v1/runs/counts here whatever the order (TestCountsRoute).
	{method: http.MethodGet, path: "/v1/runs/counts", handle: (*Server).counts},
	{method: http.MethodGet, path: "/v1/runs/{id}", handle: (*Server).getRun},
	{method: http.MethodGet, path: "/v1/runs/{id}/result", handle: (*Server).result},
	{method: http.MethodPost, path: "/v1/runs/{id}/cancel", handle: (*Server).cancelRun},
	{method: http.MethodPost, path: "/v1/runs/{id}/unblock", handle: (*Server).unblockRun},
	{method: http.MethodPost, path: "/v1/runs/{id}/rerun", handle: (*Server).rerunRun},
	{method: http.MethodPost, path: pathSendEvent, handle: (*Server).sendEvent},
	{method: http.MethodPost, path: pathResumeHook, handle: (*Server).resumeHook},
	{method: http.MethodGet, path: "/v1/workers", handle: (*Server).workers},
	{method: http.MethodGet, path: "/v1/engine", handle: (*Server).engine},
	{method: http.MethodDelete, path: "/v1/task-keys/{key}", handle: (*Server).resetKey},
	// The task-key reset's first name, before HTTP's Idempotency-Key (a
	// run ID) and task keys had separate words.
	{method: http.MethodDelete, path: "/v1/idempotency-keys/{key}", deprecated: true, handle: (*Server).resetKey},
	{method: http.MethodPost, path: "/v1/webhooks/{source}", public: true, handle: (*Server).webhook},
	{method: http.MethodGet, path: "/v1/openapi.yaml", public: true, handle: (*Server).openapi},
}

// Paths and patterns of the routes the access log (RequestLog) reads
// differently: a start's name is a workflow and its Idempotency-Key a run
// ID; an event's name is an event and its Idempotency-Key an event ID.
const (
	pathStart         = "/v1/workflows/{name}/runs"
	pathSendEvent     = "/v1/runs/{id}/events/{name}"
	pathResumeHook    = "/v1/hooks/{token}"
	patternStart      = http.MethodPost + " " + pathStart
	patternSendEvent  = http.MethodPost + " " + pathSendEvent
	patternResumeHook = http.MethodPost + " " + pathResumeHook
)

// unmatched is the route Observe gets for a request no route matches.
const unmatched = "unmatched"

// New returns the API server for cfg. It reports a missing backend, an
// empty token and a webhook source that is invalid or named twice.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("httpapi: Config.Backend is required")
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), sources: make(map[string]webhook.Source), log: cfg.Logger, maxBody: MaxBodyBytes}
	tokens, err := token.NewSet(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("httpapi: Config.Tokens: %w", err)
	}
	s.tokens = tokens
	for i, src := range cfg.Sources {
		if err := src.Validate(); err != nil {
			return nil, fmt.Errorf("httpapi: Config.Sources[%d]: %w", i, err)
		}
		if _, dup := s.sources[src.Name]; dup {
			return nil, fmt.Errorf("httpapi: Config.Sources[%d]: webhook source %q is configured twice", i, src.Name)
		}
		s.sources[src.Name] = src
	}
	for _, rt := range routes {
		s.mux.Handle(rt.pattern(), s.guard(rt))
	}
	return s, nil
}

// ServeHTTP answers r: a route of the table, or a problem (404, 405) for a
// request none matches. Every request is reported to Config.Observe once.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	begin := time.Now()
	rec := &recorder{ResponseWriter: w}
	defer func() {
		if s.cfg.Observe != nil {
			route := r.Pattern
			if route == "" {
				route = unmatched
			}
			s.cfg.Observe(route, rec.status(), time.Since(begin))
		}
	}()
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.noRoute(rec, r)
		return
	}
	s.mux.ServeHTTP(rec, r)
}

// noRoute answers a request no route matches with the mux's status (404,
// or 405 with its Allow header) as a problem.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	probe := &probeWriter{header: http.Header{}}
	s.mux.ServeHTTP(probe, r)
	if allow := probe.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	code := probe.code
	if code < 400 {
		code = http.StatusNotFound
	}
	writeProblem(w, Problem{Status: code, Detail: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
}

// guard wraps a route's handler with authentication and panic recovery,
// and marks the answers of a deprecated route.
func (s *Server) guard(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.deprecated {
			w.Header().Set("Deprecation", "true")
		}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error().Str("route", rt.pattern()).Str("panic", fmt.Sprint(v)).Msg("httpapi: handler panicked")
				writeProblem(w, Problem{Status: http.StatusInternalServerError, Detail: "internal error"})
			}
		}()
		if !rt.public && !s.authorized(w, r) {
			return
		}
		rt.handle(s, w, r)
	})
}

// authorized reports whether r carries one of the configured tokens (a
// bearer token, or the inspector's cookie with X-Jetflow-UI: 1), or none
// are configured; if not, it has answered 401.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	switch s.tokens.Request(r) {
	case token.Open, token.Valid:
		return true
	case token.Invalid:
		w.Header().Set("WWW-Authenticate", `Bearer realm="jetflow", error="invalid_token"`)
		writeProblem(w, Problem{Status: http.StatusUnauthorized, Detail: "the bearer token is not valid"})
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="jetflow"`)
		writeProblem(w, Problem{Status: http.StatusUnauthorized, Detail: "this route needs an Authorization: Bearer token"})
	}
	return false
}

// requestContext bounds one start or read by the request timeout and by
// the client's connection.
func (s *Server) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
}

// recorder remembers the status code written through it.
type recorder struct {
	http.ResponseWriter
	code int
}

func (w *recorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// status is the code sent, or statusClientClosed when the handler wrote
// nothing (the client went away).
func (w *recorder) status() int {
	if w.code == 0 {
		return statusClientClosed
	}
	return w.code
}

// probeWriter captures what the mux would answer to an unmatched request.
type probeWriter struct {
	header http.Header
	code   int
}

func (p *probeWriter) Header() http.Header { return p.header }
func (p *probeWriter) WriteHeader(code int) {
	if p.code == 0 {
		p.code = code
	}
}
func (p *probeWriter) Write(b []byte) (int, error) { return len(b), nil }
