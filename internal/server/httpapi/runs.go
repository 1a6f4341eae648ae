package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
)

// RunList returns page as GET /v1/runs sends it, and the producer's list
// --output json prints it: its runs are a list, [] on an empty page, never
// null.
func RunList(page jetflow.RunPage) jetflow.RunPage {
	if page.Runs == nil {
		page.Runs = []jetflow.Run{}
	}
	return page
}

// getRun is GET /v1/runs/{id}: the run's description (the run, its
// committed and open steps, its open waits).
func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	d, err := s.cfg.Backend.Describe(ctx, id)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	w.Header().Set(HeaderRunStatus, string(d.Status))
	writeJSON(w, http.StatusOK, "application/json", d)
}

// result is GET /v1/runs/{id}/result?wait=30s: 200 with the run once it
// has ended, otherwise, after waiting up to wait for it to end, 202 with
// its current state and Retry-After.
func (s *Server) result(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := state.ValidateRunID(id); err != nil {
		s.fail(w, r, "", err)
		return
	}
	q, err := strictQuery(r)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	wait, err := parseWait(q.Get("wait"))
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	run, err := s.readRun(r, id)
	if err != nil {
		s.fail(w, r, id, err)
		return
	}
	if !run.Status.Terminal() && wait > 0 {
		run, err = s.waitRun(r, id, wait)
		if err != nil {
			s.fail(w, r, id, err)
			return
		}
	}
	w.Header().Set(HeaderRunStatus, string(run.Status))
	if !run.Status.Terminal() {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusAccepted, "application/json", run)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", run)
}

// readRun reads the run within the request timeout.
func (s *Server) readRun(r *http.Request, id string) (jetflow.Run, error) {
	ctx, cancel := s.requestContext(r)
	defer cancel()
	return s.cfg.Backend.GetRun(ctx, id)
}

// waitRun waits up to wait for the run to end, or until the server begins
// to stop (Config.Stopping), and returns it as it is then. It stops early,
// with the context's error, when the client goes away.
func (s *Server) waitRun(r *http.Request, id string, wait time.Duration) (jetflow.Run, error) {
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	if s.cfg.Stopping != nil {
		defer context.AfterFunc(s.cfg.Stopping, cancel)()
	}
	run, err := s.cfg.Backend.WaitRun(ctx, id)
	if err == nil || r.Context().Err() != nil || ctx.Err() == nil {
		return run, err
	}
	return s.readRun(r, id) // the wait is over: the run as it is now
}

// parseWait reads the wait parameter: a Go duration ("30s", "1m") or whole
// seconds ("30"), from 0 (the default: answer at once) to MaxWait.
func parseWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, aerr := strconv.Atoi(v)
		if aerr != nil {
			return 0, fmt.Errorf("%w: wait %q is not a duration such as 30s", errBadRequest, clip(v))
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 || d > MaxWait {
		return 0, fmt.Errorf("%w: wait %q is outside 0s..%s", errBadRequest, clip(v), MaxWait)
	}
	return d, nil
}

// listRuns is GET
// /v1/runs?workflow=&status=&prefix=&since=&until=&attr.<name>=&cursor=&limit=:
// one page of runs, newest first by their last status change.
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	q, err := strictQuery(r)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	opts, err := ParseListQuery(q)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	page, err := s.cfg.Backend.ListRuns(ctx, opts)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", RunList(page))
}

// ParseListQuery reads the list parameters of GET /v1/runs: workflow,
// status, prefix, since and until (RFC 3339), attr.<name> (attributes,
// ParseAttributes), cursor and limit. An error matches errBadRequest (400)
// and names the parameter; the cursor, opaque here, is checked by ListRuns.
func ParseListQuery(q url.Values) (jetflow.ListOptions, error) {
	opts := jetflow.ListOptions{Workflow: q.Get("workflow"), Status: jetflow.RunStatus(q.Get("status")),
		RunIDPrefix: q.Get("prefix"), After: q.Get("cursor")}
	attrs, err := ParseAttributes(q)
	if err != nil {
		return opts, err
	}
	opts.Attributes = attrs
	if opts.Workflow != "" {
		if err := state.ValidateName(opts.Workflow); err != nil {
			return opts, fmt.Errorf("%w: workflow %q: %w", errBadRequest, clip(opts.Workflow), err)
		}
	}
	if opts.Status != "" && !state.ValidStatus(state.Status(opts.Status)) {
		return opts, fmt.Errorf("%w: status %q: want running, blocked, completed, failed or cancelled", errBadRequest, clip(string(opts.Status)))
	}
	if opts.RunIDPrefix != "" {
		if err := state.ValidateRunID(opts.RunIDPrefix); err != nil {
			return opts, fmt.Errorf("%w: prefix %q: not the start of a run ID: %w", errBadRequest, clip(opts.RunIDPrefix), err)
		}
	}
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"since", &opts.Since}, {"until", &opts.Until}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return opts, fmt.Errorf("%w: %s %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", errBadRequest, p.name, clip(v))
		}
		*p.t = t
	}
	if !opts.Since.IsZero() && !opts.Until.IsZero() && !opts.Since.Before(opts.Until) {
		return opts, fmt.Errorf("%w: since %s is not before until %s", errBadRequest, q.Get("since"), q.Get("until"))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > jetflow.MaxListLimit {
			return opts, fmt.Errorf("%w: limit %q: want 1..%d", errBadRequest, clip(v), jetflow.MaxListLimit)
		}
		opts.Limit = n
	}
	return opts, nil
}

// AttrParam prefixes a query parameter that names an attribute:
// attr.<name>=<value>, on a start (the run's attributes) and on a list
// (the runs with them).
const AttrParam = "attr."

// ParseAttributes reads the attr.<name>=<value> parameters of q (nil when
// there are none). A name or value outside the limits of
// jetflow.WithAttributes, or a name given twice, is an error matching
// errBadRequest and jetflow.ErrInvalidAttributes that names the attribute.
func ParseAttributes(q url.Values) (map[string]string, error) {
	var attrs map[string]string
	for key, values := range q {
		name, ok := strings.CutPrefix(key, AttrParam)
		if !ok {
			continue
		}
		if len(values) != 1 {
			return nil, fmt.Errorf("%w: %w: attribute %q given %d times, want once", errBadRequest, jetflow.ErrInvalidAttributes, clip(name), len(values))
		}
		if attrs == nil {
			attrs = map[string]string{}
		}
		attrs[name] = values[0]
	}
	if err := state.ValidateAttributes(attrs); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	return attrs, nil
}

// counts is GET /v1/runs/counts?workflow=: how many kept runs are in each
// state, of one workflow or of all.
func (s *Server) counts(w http.ResponseWriter, r *http.Request) {
	q, err := strictQuery(r)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	workflow := q.Get("workflow")
	if workflow != "" {
		if err := state.ValidateName(workflow); err != nil {
			s.fail(w, r, "", fmt.Errorf("%w: workflow %q: %w", errBadRequest, clip(workflow), err))
			return
		}
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	counts, err := s.cfg.Backend.CountRuns(ctx, workflow)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", counts)
}

// clip shortens a caller's value for an error message.
func clip(v string) string {
	if len(v) > 64 {
		return v[:64] + "..."
	}
	return v
}

// strictQuery is r's query string, or a bad request when it does not
// parse (a stray %, a bad escape): a filter dropped in silence would
// answer another question than the one asked.
func strictQuery(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed query string: %w", errBadRequest, err)
	}
	return q, nil
}
