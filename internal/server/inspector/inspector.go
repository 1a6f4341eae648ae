// Package inspector is jetflow's web inspector, served by producer serve
// under /ui/: a single page (plain HTML, CSS and JavaScript embedded in
// the binary, no build step) that lists runs and shows one run's
// timeline, reading the JSON API under /v1/ from the browser. Its actions
// go through that API too (cancel, unblock, rerun: POST
// /v1/runs/{id}/rerun, after a dry run the dialog shows), except "start
// again", which this package serves (/ui/api/runs/{id}/start-again).
//
// With API tokens configured, the inspector is protected by the same
// tokens. A browser cannot send a bearer header when it navigates, so a
// page request without a valid token answers 401 with a login form; the
// form posts the token to /ui/login, which sets it as an HttpOnly,
// SameSite=Strict cookie. The page's own requests to the API carry the
// header X-Jetflow-UI: 1, with which the API accepts the cookie
// (internal/server/inspector/token).
package inspector

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/inspector/token"
	"github.com/jetflow/jetflow/internal/state"
)

//go:embed assets
var assets embed.FS

// Prefix is the path the inspector is served under.
const Prefix = "/ui/"

// Backend is what the inspector needs of jetflow beyond the JSON API (its
// "start again" action); *jetflow.Client satisfies it.
type Backend interface {
	GetRun(ctx context.Context, runID string) (jetflow.Run, error)
	StartByName(ctx context.Context, name string, input json.RawMessage, opts ...jetflow.StartOption) (jetflow.StartResult, error)
}

// Config configures the inspector.
type Config struct {
	// Backend serves the start-again action (required); the other
	// actions are the API's.
	Backend Backend
	// Tokens are the API tokens (the same as the API's); empty: the
	// inspector is open, as the API is then.
	Tokens []string
	// RequestTimeout bounds an action (default 10s).
	RequestTimeout time.Duration
	// Logger receives server-side failures; never tokens or payloads.
	Logger zerolog.Logger
}

// Handler serves the inspector under Prefix. It is safe for concurrent use.
type Handler struct {
	cfg    Config
	tokens *token.Set
	mux    *http.ServeMux
	static http.Handler
}

// New returns the inspector for cfg, or an error for a missing backend or
// an empty token.
func New(cfg Config) (*Handler, error) {
	if cfg.Backend == nil {
		return nil, errors.New("inspector: Config.Backend is required")
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	tokens, err := token.NewSet(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("inspector: Config.Tokens: %w", err)
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, tokens: tokens, mux: http.NewServeMux(),
		static: http.StripPrefix(Prefix+"assets/", http.FileServerFS(sub))}
	h.mux.HandleFunc("GET "+Prefix+"{$}", h.page)
	h.mux.HandleFunc("GET "+Prefix+"assets/", h.asset)
	h.mux.HandleFunc("POST "+Prefix+"login", h.login)
	h.mux.HandleFunc("POST "+Prefix+"logout", h.logout)
	h.mux.HandleFunc("POST "+Prefix+"api/runs/{id}/start-again", h.startAgain)
	return h, nil
}

// Register mounts h on mux under Prefix, and redirects "/" to it: how
// producer serve mounts the inspector next to the API.
func Register(mux *http.ServeMux, h *Handler) {
	mux.Handle(Prefix, h)
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
}

// ServeHTTP answers a request under Prefix.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	// The page runs only its own script, is never framed, and sends no
	// referrer (run IDs are in its URLs).
	hdr.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	h.mux.ServeHTTP(w, r)
}

// page serves the single page, or the login form (401) to a browser
// without a valid token.
func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	if res := h.tokens.Cookie(r); !res.OK() {
		h.loginPage(w, http.StatusUnauthorized, res == token.Invalid)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// "Log out" only where there is something to log out of: without
	// tokens the inspector is open and keeps no cookie.
	if err := pageTemplate.Execute(w, struct{ Auth bool }{!h.tokens.Open()}); err != nil {
		h.cfg.Logger.Warn().Err(err).Msg("inspector: writing the page")
	}
}

// pageTemplate is the single page; html/template escapes what it shows.
var pageTemplate = template.Must(template.ParseFS(assets, "assets/index.html"))

// asset serves the page's script, style sheet and icon: public, they
// hold nothing but code. The page and the login form are templates,
// served only as pages.
func (h *Handler) asset(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/") || strings.HasSuffix(r.URL.Path, ".html") {
		http.NotFound(w, r) // no directory listings, no raw templates
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	h.static.ServeHTTP(w, r)
}

// loginTemplate is the login form; html/template escapes what it shows.
var loginTemplate = template.Must(template.ParseFS(assets, "assets/login.html"))

// loginPage answers code with the login form; wrong says the token given
// was not valid.
func (h *Handler) loginPage(w http.ResponseWriter, code int, wrong bool) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := loginTemplate.Execute(w, struct{ Wrong bool }{wrong}); err != nil {
		h.cfg.Logger.Warn().Err(err).Msg("inspector: writing the login page")
	}
}

// login takes the token of the login form: a valid one is set as the
// cookie (HttpOnly, SameSite=Strict) and the browser is sent to the page
// (303); a wrong one gets the form again (401).
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	tok := r.PostFormValue("token")
	if h.tokens.Open() {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	if !h.tokens.Match(tok) {
		h.loginPage(w, http.StatusUnauthorized, true)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: token.CookieName, Value: token.CookieValue(tok), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// logout clears the cookie and shows the login form.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: token.CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// startAgain is POST /ui/api/runs/{id}/start-again: it starts the run
// ID's workflow again with the run's stored input, under the same run ID,
// with a conflict policy that starts a new generation only after the run
// failed or was cancelled (a running or completed run is refused: 409).
// Authorized as an API request (bearer, or cookie with X-Jetflow-UI: 1).
func (h *Handler) startAgain(w http.ResponseWriter, r *http.Request) {
	if res := h.tokens.Request(r); !res.OK() {
		detail := "this action needs a token: log in again"
		if res == token.Invalid {
			detail = "the token is not valid"
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="jetflow"`)
		writeProblem(w, http.StatusUnauthorized, detail)
		return
	}
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		writeProblem(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.RequestTimeout)
	defer cancel()
	run, err := h.cfg.Backend.GetRun(ctx, id)
	if err != nil {
		h.fail(w, err)
		return
	}
	policy := jetflow.ConflictPolicy{WhileRunning: jetflow.RejectWhileRunning, AfterCompleted: jetflow.RejectAfterEnd, AfterFailed: jetflow.StartNew}
	res, err := h.cfg.Backend.StartByName(ctx, run.Workflow, run.Input,
		jetflow.WithRunID(id), jetflow.WithConflictPolicy(policy), jetflow.WithSource("inspector"))
	if err != nil {
		h.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", res)
}

// statuses maps the errors of an action to HTTP statuses, as the API does.
var statuses = []struct {
	err  error
	code int
}{
	{jetflow.ErrRunNotFound, http.StatusNotFound},
	// Only while workers run (no worker running at all is ErrNoWorker,
	// which matches ErrUnavailable: 503).
	{jetflow.ErrUnknownWorkflow, http.StatusNotFound},
	{jetflow.ErrDuplicateRejected, http.StatusConflict},
	{jetflow.ErrIdempotencyConflict, http.StatusUnprocessableEntity},
	{jetflow.ErrInvalidInput, http.StatusBadRequest},
	{jetflow.ErrInvalidRunID, http.StatusBadRequest},
	{jetflow.ErrPermissionDenied, http.StatusForbidden},
	{jetflow.ErrUnavailable, http.StatusServiceUnavailable},
}

// fail answers err as a problem; an error it does not know is logged and
// answered 500.
func (h *Handler) fail(w http.ResponseWriter, err error) {
	for _, s := range statuses {
		if errors.Is(err, s.err) {
			if s.code == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			writeProblem(w, s.code, err.Error())
			return
		}
	}
	h.cfg.Logger.Error().Err(err).Msg("inspector: start again failed")
	writeProblem(w, http.StatusInternalServerError, "internal error")
}

// problem is an RFC 9457 problem, as the API answers errors.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, code int, detail string) {
	writeJSON(w, code, "application/problem+json", problem{Type: "about:blank", Title: http.StatusText(code), Status: code, Detail: detail})
}

func writeJSON(w http.ResponseWriter, code int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
