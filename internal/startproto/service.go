// Package startproto is jetflow's NATS start protocol (docs/protocol.md),
// what a client in any language speaks to start a run: the request-reply
// start service on jetflow.admit.<workflow> (Serve), the durable start
// consumer on the JETFLOW_STARTS stream (ServeDurable), the envelope and
// reply formats with their error codes, and the monitor of envelopes that
// no worker serves (WatchUnserved). It decodes and answers; what a start
// gets is decided by dedupe.Admitter, the same admission as the Go SDK's.
package startproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/reqreply"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/jetflowtype"
)

// AdmitSubjectPrefix is where workers answer start requests by request-reply:
// jetflow.admit.<workflow>. With no worker serving a workflow, a request gets
// "no responders"; callers tell an unknown workflow from a known one with no
// worker running, or from a deployment none of whose workers runs yet, by
// the workflow's record and the workers' liveness records in
// jetflow_workflows (internal/roster).
const AdmitSubjectPrefix = "jetflow.admit."

// EntryHeader is the optional NATS header of a start request naming the
// interface the start came in through ("http", "webhook", "sdk" for the Go
// SDK's typed Start by request; default "nats"). It labels the starts
// metric and changes nothing else.
const EntryHeader = "Jetflow-Entry"

// ErrRunIDRequired: the start named no run ID and did not ask for a
// generated one, or asked for one from a workflow that requires a
// caller-chosen run ID (RequireRunID).
var ErrRunIDRequired = errors.New("jetflow: run ID required")

// StartRequest is the start envelope any NATS client can send.
type StartRequest struct {
	// RunID is the idempotency key. It is never filled in for the caller:
	// absent, a start is refused unless GenerateRunID asks for a generated
	// one; present but empty or null, it is an invalid run ID.
	RunID string `json:"run_id,omitempty"`
	// GenerateRunID asks for a generated run ID (request-reply only): every
	// such start creates a new run. It excludes RunID.
	GenerateRunID bool            `json:"generate_run_id,omitempty"`
	Input         json.RawMessage `json:"input"`
	Source        string          `json:"source,omitempty"`
	// Fingerprint is "strict" (default: a duplicate with another input is
	// a conflict) or "ignore" (it is an ordinary duplicate).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Policy overrides the workflow's conflict policy for this start.
	Policy *dedupe.EnvelopePolicy `json:"policy,omitempty"`
	// Attributes are the run's business keys (at most 8; names
	// [a-z][a-z0-9_]{0,31}; values 1..64 bytes of printable UTF-8), by
	// which runs are listed. The first start's are kept.
	Attributes map[string]string `json:"attributes,omitempty"`
	// RerunOf asks for a rerun of an ended run of the workflow instead of
	// a start with Input (request-reply only): the worker plans it from
	// the run's records (Reruns) and admits it under RunID, by default
	// the rerun's own default ID.
	RerunOf *RerunOf `json:"rerun_of,omitempty"`

	// runIDGiven records that the envelope had a run_id field (possibly ""
	// or null), as opposed to none.
	runIDGiven bool
}

// RerunOf names the run a rerun request reruns and its first step to run
// again ("" for where the run stopped).
type RerunOf struct {
	RunID string `json:"run_id"`
	From  string `json:"from,omitempty"`
}

// Reruns plans and records reruns for the start service.
type Reruns interface {
	// Plan is the admission request of the rerun r of a run of workflow
	// under run ID rerunID ("": its default), or why it cannot be
	// (workflow.ErrRunNotFound, ErrRunNotEnded, ErrStepNotReached,
	// state.ErrInvalidRunID, another workflow's run: ErrCorrupt).
	Plan(ctx context.Context, workflow string, r RerunOf, rerunID string) (dedupe.Request, error)
	// Listed adds the rerun run, as admitted, to its source's audit.
	Listed(ctx context.Context, run state.Run, source string) error
}

// StartReply answers a StartRequest: an outcome, or an error.
type StartReply struct {
	Outcome    string       `json:"outcome,omitempty"`
	RunID      string       `json:"run_id,omitempty"`
	Workflow   string       `json:"workflow,omitempty"`
	Status     state.Status `json:"status,omitempty"`
	Duplicates int64        `json:"duplicates,omitempty"`
	// AfterExpiry: created over an expired run with the same run ID.
	AfterExpiry bool `json:"after_expiry,omitempty"`
	// Generation is the run's generation the start created or got; sent
	// on every success (a pointer, so that 0 is sent and a reply of an
	// earlier version, without it, is told apart).
	Generation *int        `json:"generation,omitempty"`
	Error      *ReplyError `json:"error,omitempty"`

	// cause is the admission error behind an internal Error (not sent).
	cause error
}

// ReplyError is a typed error in a StartReply.
type ReplyError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Conflict says what differs, with code conflict (absent from the
	// reply of a worker of an earlier version).
	Conflict *ReplyConflict `json:"conflict,omitempty"`
}

// ReplyConflict is the detail of an idempotency conflict
// (jetflowtype.ConflictError, whose fields it carries).
type ReplyConflict struct {
	// Field is what differs: "workflow" or "input".
	Field string `json:"field"`
	// Stored and Requested are the run's and the start's values of Field
	// (for the input, short prefixes of their fingerprints).
	Stored    string `json:"stored"`
	Requested string `json:"requested"`
	// Fields are the top-level input fields that differ, by name (never
	// values), when both inputs are JSON objects; MoreFields counts those
	// left out (at most jetflowtype.MaxConflictFields are named).
	Fields     []jetflowtype.FieldDiff `json:"fields,omitempty"`
	MoreFields int                     `json:"more_fields,omitempty"`
}

// ConflictReply is the conflict detail of err, nil when err is not a
// *jetflowtype.ConflictError.
func ConflictReply(err error) *ReplyConflict {
	var ce *jetflowtype.ConflictError
	if !errors.As(err, &ce) {
		return nil
	}
	return &ReplyConflict{Field: ce.Field, Stored: ce.Stored, Requested: ce.Requested, Fields: ce.Fields, MoreFields: ce.MoreFields}
}

// ConflictError is the error a conflict reply stands for: the worker's
// *jetflowtype.ConflictError, for runID, rebuilt from the detail.
func (c *ReplyConflict) ConflictError(runID string) *jetflowtype.ConflictError {
	return &jetflowtype.ConflictError{RunID: runID, Field: c.Field, Stored: c.Stored, Requested: c.Requested,
		Fields: c.Fields, MoreFields: c.MoreFields}
}

// Error codes of a StartReply.
const (
	CodeMalformed    = "malformed_request"
	CodeInvalidRunID = "invalid_run_id"
	CodeInvalidInput = "invalid_input"
	CodeTooLarge     = "input_too_large"
	CodeConflict     = "conflict"
	CodeRejected     = "rejected"
	CodeBadPolicy    = "invalid_policy"
	CodeRunIDNeeded  = "run_id_required"
	CodeBadAttrs     = "invalid_attributes"
	CodeInternal     = "internal"
	// Codes of a rerun request (rerun_of): the run is unknown, has not
	// ended, or never reached the step.
	CodeRunNotFound    = "run_not_found"
	CodeRunNotEnded    = "run_not_ended"
	CodeStepNotReached = "step_not_reached"
)

// ReplyCodes lists every error code a StartReply can carry (the reply's
// JSON Schema enumerates the same).
var ReplyCodes = []string{CodeMalformed, CodeInvalidRunID, CodeInvalidInput, CodeTooLarge,
	CodeConflict, CodeRejected, CodeBadPolicy, CodeRunIDNeeded, CodeBadAttrs, CodeInternal,
	CodeRunNotFound, CodeRunNotEnded, CodeStepNotReached}

// resolveRunID settles the run ID of a request-reply envelope. A run_id
// that is present must be valid: "" and null are invalid run IDs, never a
// request for a generated one (a script whose ID variable is unset must not
// start a new run on every retry). An envelope without run_id is refused
// unless it asks for a generated ID with generate_run_id, which excludes
// run_id and which a workflow that requires a run ID refuses too.
func (sr *StartRequest) resolveRunID(workflow string, requireRunID bool) error {
	switch {
	case sr.GenerateRunID && sr.runIDGiven:
		return fmt.Errorf("%w: start envelope: run_id and generate_run_id exclude each other", state.ErrCorrupt)
	case sr.GenerateRunID && requireRunID:
		return fmt.Errorf("%w: workflow %s needs a caller-chosen run ID, not a generated one (run_id, or the Idempotency-Key header over HTTP)", ErrRunIDRequired, workflow)
	case sr.GenerateRunID:
		sr.RunID = nuid.Next()
	case sr.runIDGiven && sr.RunID == "":
		return fmt.Errorf("%w: run_id is empty or null (to have one generated, leave it out and set generate_run_id)", state.ErrInvalidRunID)
	case !sr.runIDGiven:
		return fmt.Errorf("%w: the start envelope names no run_id: set run_id to your idempotency key, or generate_run_id to true for a new run each time", ErrRunIDRequired)
	}
	return nil
}

// parseStartRequest reads an envelope's JSON: one object, known fields
// only.
func parseStartRequest(b []byte) (StartRequest, error) {
	var sr StartRequest
	dec := json.NewDecoder(bytes.NewReader(b))
	// A misspelt field ("runId") must not silently start a new run each time.
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sr); err != nil {
		return StartRequest{}, fmt.Errorf("%w: start envelope: %w", state.ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return StartRequest{}, fmt.Errorf("%w: start envelope: data after the JSON object", state.ErrCorrupt)
	}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return StartRequest{}, fmt.Errorf("%w: start envelope is null", state.ErrCorrupt)
	}
	// Tell a run_id that is absent from one that is "" or null: the
	// second is a caller's mistake, not a request.
	var probe struct {
		RunID json.RawMessage `json:"run_id"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return StartRequest{}, fmt.Errorf("%w: start envelope: %w", state.ErrCorrupt, err)
	}
	sr.runIDGiven = probe.RunID != nil
	if string(probe.RunID) == "null" {
		sr.RunID = "" // {"run_id":"a","run_id":null}: the last one counts
	}
	return sr, nil
}

// request validates a parsed envelope (whose run ID is set) and turns it
// into the admission request.
func (sr StartRequest) request(workflow string, base jetflowtype.ConflictPolicy) (dedupe.Request, error) {
	if len(sr.Input) == 0 {
		sr.Input = json.RawMessage("null")
	}
	if sr.Fingerprint != "" && sr.Fingerprint != "strict" && sr.Fingerprint != "ignore" {
		return dedupe.Request{}, fmt.Errorf("%w: start envelope: fingerprint must be \"strict\" or \"ignore\", got %q", state.ErrCorrupt, sr.Fingerprint)
	}
	req := dedupe.Request{RunID: sr.RunID, Workflow: workflow, Input: sr.Input, Source: sr.Source, IgnoreInput: sr.Fingerprint == "ignore", Policy: base,
		Attributes: sr.Attributes}
	if sr.Policy != nil {
		p, err := sr.Policy.Policy(base)
		if err != nil {
			return dedupe.Request{}, err
		}
		req.Policy = p
	}
	return req, dedupe.Validate(req)
}

// maxConcurrentStarts bounds the start requests a worker answers at once.
const maxConcurrentStarts = 64

// InputChecker decodes input into the workflow's input type; an error means
// the run could never start.
type InputChecker func(input json.RawMessage) error

// Served is a workflow a worker answers start requests for.
type Served struct {
	Check InputChecker
	// Policy is the workflow's default conflict policy.
	Policy jetflowtype.ConflictPolicy
	// Retention is the workflow's run retention (0: the deployment's).
	Retention time.Duration
	// RequireRunID refuses request-reply starts that ask for a generated
	// run ID (generate_run_id).
	RequireRunID bool
}

// Serve answers start requests for the given workflows through the same
// Admit as the Go SDK. A malformed envelope, an invalid run ID or an input
// the workflow cannot decode is answered with a typed error and stores
// nothing. The returned function stops serving.
func Serve(nc *nats.Conn, a *dedupe.Admitter, served map[string]Served, reruns Reruns, timeout time.Duration, log zerolog.Logger) (func() error, error) {
	subjects := make([]string, 0, len(served))
	for name := range served {
		subjects = append(subjects, AdmitSubjectPrefix+name)
	}
	// Requests are answered concurrently (a slow admission must not hold up
	// the others), at most maxConcurrentStarts at a time per worker.
	return reqreply.Serve(nc, "jetflow_admit", subjects, maxConcurrentStarts, log, func(m *nats.Msg) []byte {
		name := strings.TrimPrefix(m.Subject, AdmitSubjectPrefix)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		ctx = tracing.FromNATS(ctx, m.Header) // the start's trace context, if any
		reply := handleStart(ctx, a, reruns, name, served[name], m.Data, entryOf(m.Header))
		logRefusal(log, name, reply)
		b, err := json.Marshal(reply)
		if err != nil { // a reply is plain data: never happens
			b = []byte(`{"error":{"code":"internal","message":"cannot encode the reply"}}`)
		}
		return b
	})
}

// logRefusal logs a start request that was answered with an error (an
// input the workflow cannot decode, a conflict, an invalid run ID...): at
// info level, the caller's mistake, with the workflow, the run ID when the
// request named one, the reply's code and reason; at warn level when the
// engine could not decide (CodeInternal).
func logRefusal(log zerolog.Logger, workflow string, reply StartReply) {
	if reply.Error == nil {
		return
	}
	ev := log.Info()
	if reply.Error.Code == CodeInternal {
		ev = log.Warn()
	}
	ev = ev.Str("workflow", workflow)
	if reply.RunID != "" {
		ev = ev.Str("run_id", reply.RunID)
	}
	ev.Str("code", reply.Error.Code).Str("reason", reply.Error.Message).Msg("start refused")
}

// entryOf reads a start request's EntryHeader: "http", "webhook" or
// "sdk" when it says so, "nats" otherwise (a label must stay within a
// known set).
func entryOf(h nats.Header) string {
	switch e := h.Get(EntryHeader); e {
	case "http", "webhook", "sdk":
		return e
	default:
		return "nats"
	}
}

// handleStart answers a request-reply start: decode the envelope and
// settle its run ID (resolveRunID: generated only on request), then
// admitEnvelope.
func handleStart(ctx context.Context, a *dedupe.Admitter, reruns Reruns, workflow string, wf Served, b []byte, entry string) StartReply {
	sr, err := parseStartRequest(b)
	if err != nil {
		a.ObserveRefusal(entry, workflow)
		return errorReply(err)
	}
	if sr.RerunOf != nil {
		return handleRerun(ctx, a, reruns, workflow, wf, sr, entry)
	}
	if err := sr.resolveRunID(workflow, wf.RequireRunID); err != nil {
		a.ObserveRefusal(entry, workflow)
		return errorReply(err)
	}
	req, err := sr.request(workflow, wf.Policy)
	if err != nil {
		a.ObserveRefusal(entry, workflow)
		return errorReply(err)
	}
	req.Entry = entry
	reply, _ := admitEnvelope(ctx, a, wf, req)
	return reply
}

// handleRerun answers a rerun request (sr.RerunOf): the rerun planned
// from the run's records (Reruns.Plan), admitted as a start, and, when
// the admitted run is that rerun, listed in its source's audit.
func handleRerun(ctx context.Context, a *dedupe.Admitter, reruns Reruns, workflow string, wf Served, sr StartRequest, entry string) StartReply {
	if reruns == nil {
		return errorReply(fmt.Errorf("%w: this worker plans no rerun", state.ErrCorrupt))
	}
	if sr.runIDGiven {
		if err := state.ValidateRunID(sr.RunID); err != nil {
			return errorReply(err)
		}
	}
	req, err := reruns.Plan(ctx, workflow, *sr.RerunOf, sr.RunID)
	if err != nil {
		a.ObserveRefusal(entry, workflow)
		return errorReply(err)
	}
	req.Source, req.Entry = sr.Source, entry
	reply, res := admitEnvelope(ctx, a, wf, req)
	if l := res.Run.Rerun; reply.Error == nil && l != nil && l.RunID == req.Rerun.RunID && l.Generation == req.Rerun.Generation {
		if err := reruns.Listed(ctx, res.Run, sr.Source); err != nil {
			return StartReply{RunID: req.RunID, Error: &ReplyError{Code: CodeInternal,
				Message: "the rerun started, but its source's audit does not list it yet (ask again): " + err.Error()}, cause: err}
		}
	}
	return reply
}

// admitEnvelope is the admission of a decoded start envelope, shared by the
// request-reply service and the durable start stream: the workflow's input
// check, then the same Admit as the Go SDK (policy, fingerprint, audit).
// It returns the reply and the admission's result (zero on an error).
func admitEnvelope(ctx context.Context, a *dedupe.Admitter, wf Served, req dedupe.Request) (StartReply, dedupe.Result) {
	req.Retention = wf.Retention
	if err := wf.Check(req.Input); err != nil {
		a.ObserveRefusal(req.Entry, req.Workflow)
		return StartReply{RunID: req.RunID, Error: &ReplyError{Code: CodeInvalidInput, Message: err.Error()}}, dedupe.Result{}
	}
	res, err := a.Admit(ctx, req)
	if errors.Is(err, state.ErrInputTooLarge) {
		return StartReply{RunID: req.RunID, Error: &ReplyError{Code: CodeTooLarge, Message: err.Error()}}, dedupe.Result{}
	}
	if errors.Is(err, jetflowtype.ErrIdempotencyConflict) {
		return StartReply{RunID: req.RunID, Status: res.Run.Status, Error: &ReplyError{Code: CodeConflict, Message: err.Error(), Conflict: ConflictReply(err)}}, dedupe.Result{}
	}
	if errors.Is(err, jetflowtype.ErrDuplicateRejected) {
		return StartReply{RunID: req.RunID, Status: res.Run.Status, Error: &ReplyError{Code: CodeRejected, Message: err.Error()}}, dedupe.Result{}
	}
	if err != nil {
		return StartReply{RunID: req.RunID, Error: &ReplyError{Code: CodeInternal, Message: err.Error()}, cause: err}, dedupe.Result{}
	}
	return StartReply{
		Outcome: res.Outcome.String(), RunID: res.Run.RunID, Workflow: res.Run.Workflow,
		Status: res.Run.Status, Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry, Generation: &res.Run.Generation,
	}, res
}

func errorReply(err error) StartReply {
	code := CodeMalformed
	switch {
	case errors.Is(err, state.ErrInvalidRunID):
		code = CodeInvalidRunID
	case errors.Is(err, state.ErrInputTooLarge):
		code = CodeTooLarge
	case errors.Is(err, jetflowtype.ErrInvalidConflictPolicy):
		code = CodeBadPolicy
	case errors.Is(err, ErrRunIDRequired):
		code = CodeRunIDNeeded
	case errors.Is(err, state.ErrInvalidAttributes):
		code = CodeBadAttrs
	case errors.Is(err, state.ErrCorrupt), errors.Is(err, state.ErrInvalidName):
		code = CodeMalformed
	case errors.Is(err, jetflowtype.ErrRunNotFound):
		code = CodeRunNotFound
	case errors.Is(err, jetflowtype.ErrRunNotEnded):
		code = CodeRunNotEnded
	case errors.Is(err, jetflowtype.ErrStepNotReached):
		code = CodeStepNotReached
	}
	return StartReply{Error: &ReplyError{Code: code, Message: err.Error()}}
}
