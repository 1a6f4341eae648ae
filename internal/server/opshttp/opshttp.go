// Package opshttp serves the operations endpoints shared by the worker and
// the producer: GET /metrics (Prometheus exposition), GET /healthz
// (liveness) and GET /readyz (readiness checks).
//
// # Serving
//
// Listen binds the address first, so a caller (or a test passing ":0")
// learns the bound address from the listener before serving; Serve then
// runs an http.Server with timeouts on it until its context is done and
// shuts down gracefully:
//
//	ln, err := opshttp.Listen(":9090")
//	if err != nil { ... }
//	log.Info().Str("addr", ln.Addr().String()).Msg("ops listening")
//	err = opshttp.Serve(ctx, ln, opshttp.Handler(reg, opshttp.Check{Name: "nats", Fn: ping}))
package opshttp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Routes registered by Register and served by Handler.
const (
	RouteMetrics = "GET /metrics"
	RouteHealthz = "GET /healthz"
	RouteReadyz  = "GET /readyz"
)

// CheckTimeout bounds each readiness check of one /readyz request.
const CheckTimeout = 2 * time.Second

// maxCheckMessage bounds the length of one check's error in /readyz.
const maxCheckMessage = 256

// Check is one readiness condition; a non-nil error means not ready.
// Its error text is shown in /readyz responses, so it must not carry
// secrets. Fn should return when its context is done; a nil Fn or a panic
// counts as a failure. Names should be unique (a failure wins over a
// same-named pass).
type Check struct {
	Name string
	Fn   func(context.Context) error
}

// Handler serves GET /metrics (promhttp for g, which must not be nil), GET /healthz (200 "ok": the
// process is alive, no dependency is checked) and GET /readyz (every check
// run concurrently, each bounded by CheckTimeout; 200 when all pass, 503
// otherwise, with the JSON body {"ready":bool,"checks":{name:"ok"|error}}).
// HEAD is answered like GET; other methods on those paths get 405 and other
// paths 404.
func Handler(g prometheus.Gatherer, checks ...Check) http.Handler {
	mux := http.NewServeMux()
	Register(mux, g, checks...)
	return mux
}

// Register adds the three routes of Handler to mux, for a server that
// shares its port with other routes. Like any ServeMux registration it
// panics if mux already has a conflicting pattern for those paths, so
// register once per mux.
func Register(mux *http.ServeMux, g prometheus.Gatherer, checks ...Check) {
	mux.Handle(RouteMetrics, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc(RouteHealthz, healthz)
	mux.Handle(RouteReadyz, readyz(append([]Check(nil), checks...)))
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n")) // a failed write means the client went away
}

// readiness is the /readyz response body.
type readiness struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

func readyz(checks []Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := readiness{Ready: true, Checks: make(map[string]string, len(checks))}
		for i, err := range runChecks(r.Context(), checks) {
			name := checks[i].Name
			if err != nil {
				body.Ready = false
				body.Checks[name] = oneLine(err.Error())
			} else if _, seen := body.Checks[name]; !seen {
				body.Checks[name] = "ok" // never hides a failure of a same-named check
			}
		}
		code := http.StatusOK
		if !body.Ready {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		// A failed write means the client went away; nothing to report to.
		_ = json.NewEncoder(w).Encode(body)
	})
}

// result is one finished check.
type result struct {
	index int
	err   error
}

// runChecks runs every check concurrently, each with CheckTimeout, and
// returns their errors in the order of checks. A check that has not
// returned by the deadline gets a timeout error (its goroutine ends when
// it returns); a panicking check gets an error.
func runChecks(ctx context.Context, checks []Check) []error {
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	results := make(chan result, len(checks)) // buffered: late checks never block
	for i, c := range checks {
		go func() { results <- result{index: i, err: runCheck(ctx, c)} }()
	}
	errs := make([]error, len(checks))
	for i, c := range checks {
		errs[i] = fmt.Errorf("check %q did not finish within %s", c.Name, CheckTimeout)
	}
	for range checks {
		select {
		case res := <-results:
			errs[res.index] = res.err
		case <-ctx.Done():
			return drain(results, errs)
		}
	}
	return errs
}

// drain records the results already delivered, without waiting for more.
func drain(results <-chan result, errs []error) []error {
	for {
		select {
		case res := <-results:
			errs[res.index] = res.err
		default:
			return errs
		}
	}
}

// runCheck runs one check, turning a missing function or a panic into an
// error.
func runCheck(ctx context.Context, c Check) (err error) {
	if c.Fn == nil {
		return fmt.Errorf("check %q has no function", c.Name)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("check %q panicked: %v", c.Name, p)
		}
	}()
	return c.Fn(ctx)
}

// oneLine folds s onto one line and bounds its length.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxCheckMessage {
		s = strings.ToValidUTF8(s[:maxCheckMessage], "") + "..."
	}
	return s
}
