package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/entry"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
)

// Response headers of a start.
const (
	// HeaderIdempotencyKey names the run ID of a start.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed is "true" on the answer to a start that found its run
	// already there (outcome existing).
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderOutcome is the start's outcome: created, existing, restarted or
	// superseded.
	HeaderOutcome = "Jetflow-Outcome"
	// HeaderRunStatus is the run's status when the answer was made.
	HeaderRunStatus = "Jetflow-Run-Status"
	// HeaderAfterExpiry is "true" when the start created a run over one
	// with the same run ID whose retention had passed: a new run, not a
	// replay of the old one.
	HeaderAfterExpiry = "Jetflow-After-Expiry"
)

// startHeaders sets the headers every successful start answer carries.
func startHeaders(h http.Header, res jetflow.StartResult) {
	h.Set(HeaderOutcome, string(res.Outcome))
	h.Set(HeaderRunStatus, string(res.Status))
	if res.AfterExpiry {
		h.Set(HeaderAfterExpiry, "true")
	}
}

// Started is the body of a successful start. It has only fields derived
// from the stored run, so that every replay of a request gets the same
// bytes.
type Started struct {
	RunID    string   `json:"run_id"`
	Workflow string   `json:"workflow"`
	Links    RunLinks `json:"links"`
}

// RunLinks are the API's URLs of a run.
type RunLinks struct {
	Run    string `json:"run"`
	Result string `json:"result"`
}

func runLinks(runID string) RunLinks {
	return RunLinks{Run: "/v1/runs/" + runID, Result: "/v1/runs/" + runID + "/result"}
}

// start is POST /v1/workflows/{name}/runs: the body is the input, the
// Idempotency-Key header the run ID, attr.<name>=<value> query parameters
// the run's attributes (ParseAttributes). A request without the header is
// refused (400, idempotency-key-required) unless it asks for a generated
// run ID with ?generate_run_id=true: a client whose key variable was unset
// must not start a new run on every retry.
func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	key, err := parseIdempotencyKey(r.Header)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	q, err := strictQuery(r)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	generate, err := parseGenerate(q)
	if err != nil {
		s.fail(w, r, "", err)
		return
	}
	attrs, err := ParseAttributes(q)
	switch {
	case err != nil:
		s.fail(w, r, key, err)
		return
	case generate && key != "":
		s.fail(w, r, key, fmt.Errorf("%w: an Idempotency-Key and generate_run_id=true exclude each other", errBadRequest))
		return
	case !generate && key == "":
		s.fail(w, r, "", fmt.Errorf("%w: no Idempotency-Key header: send one that names the intent (the same on every retry), or ?generate_run_id=true for a new run each time", jetflow.ErrRunIDRequired))
		return
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Status: http.StatusUnsupportedMediaType, RunID: key,
			Detail: "the body must be JSON: send Content-Type application/json (or none)"})
		return
	}
	if src, ok := s.webhookPrefix(key); ok {
		// The run IDs of a webhook source are its events': a start that
		// took one first would capture the event's real delivery.
		s.fail(w, r, key, fmt.Errorf("%w: Idempotency-Key %q: keys starting %q are reserved for webhook source %s", errBadRequest, key, src+"-", src))
		return
	}
	input, err := s.readJSON(w, r)
	if err != nil {
		s.fail(w, r, key, err)
		return
	}
	opts := []jetflow.StartOption{jetflow.WithSource("http")}
	if attrs != nil {
		opts = append(opts, jetflow.WithAttributes(attrs))
	}
	if generate {
		opts = append(opts, jetflow.WithGeneratedRunID())
	} else {
		opts = append(opts, jetflow.WithRunID(key))
	}
	ctx, cancel := s.requestContext(r)
	defer cancel()
	ctx = tracing.FromHTTP(ctx, r.Header) // traceparent, tracestate: the run joins the caller's trace
	res, err := s.cfg.Backend.StartByName(entry.With(ctx, entry.HTTP), name, input, opts...)
	if err != nil {
		s.fail(w, r, key, err)
		return
	}
	workflow := res.Workflow
	if workflow == "" {
		workflow = name
	}
	h := w.Header()
	h.Set("Location", runLinks(res.RunID).Run)
	startHeaders(h, res)
	if res.Outcome == jetflow.OutcomeExisting {
		h.Set(HeaderReplayed, "true")
	}
	writeJSON(w, http.StatusCreated, "application/json", Started{RunID: res.RunID, Workflow: workflow, Links: runLinks(res.RunID)})
}

// parseGenerate reads the generate_run_id query parameter: true asks for a
// generated run ID; absent is false.
func parseGenerate(q url.Values) (bool, error) {
	v := q.Get("generate_run_id")
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: generate_run_id %q: want true or false", errBadRequest, clip(v))
	}
	return b, nil
}

// parseIdempotencyKey returns the run ID that the request's
// Idempotency-Key names, "" when it has none. The header is a structured
// field string ("order-42", as the draft defines it) or, as many clients
// send it, a bare token (order-42); either way the key must be a valid run
// ID. A repeated header is refused.
func parseIdempotencyKey(h http.Header) (string, error) {
	v, ok, err := keyHeader(h)
	if err != nil || !ok {
		return "", err
	}
	if err := state.ValidateRunID(v); err != nil {
		return "", fmt.Errorf("header Idempotency-Key: %w", err)
	}
	return v, nil
}

// parseSFString decodes an RFC 8941 sf-string: a quoted string of printable
// ASCII where only \" and \\ are escapes. Nothing may follow the closing
// quote.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("text after the closing quote")
			}
			return b.String(), nil
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`a backslash must escape '"' or '\'`)
			}
			b.WriteByte(v[i])
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("character 0x%02x is not allowed in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("no closing quote")
}

// isJSON reports whether a request body of content type ct is JSON: none
// given, application/json or any +json type.
func isJSON(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// jsonSpace is JSON's insignificant white space.
const jsonSpace = " \t\r\n"

// readJSON reads the request body, at most s.maxBody bytes: an empty body
// (or only white space) is JSON null, a body over the limit ErrInputTooLarge and one that is not
// JSON ErrInvalidInput.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request) (json.RawMessage, error) {
	body, err := s.readBody(w, r)
	if err != nil {
		return nil, err
	}
	if len(bytes.Trim(body, jsonSpace)) == 0 {
		return json.RawMessage("null"), nil
	}
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: the body is not valid JSON", jetflow.ErrInvalidInput)
	}
	return body, nil
}

// readBody reads the request body, at most s.maxBody bytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.maxBody {
		return nil, fmt.Errorf("%w: the body is %d bytes, limit %d", jetflow.ErrInputTooLarge, r.ContentLength, s.maxBody)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, fmt.Errorf("%w: the body is over the limit of %d bytes", jetflow.ErrInputTooLarge, s.maxBody)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", errBadRequest, err)
	}
	return body, nil
}
