package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/entry"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/startproto"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Outcome says what a start did.
type Outcome string

const (
	// OutcomeCreated: this start created the run.
	OutcomeCreated Outcome = "created"
	// OutcomeExisting: the run already existed; the start was absorbed as a
	// duplicate and the existing run is returned.
	OutcomeExisting Outcome = "existing"
	// OutcomeSuperseded: the run was running, and the conflict policy
	// (Supersede) cancelled its generation and started a new one with this
	// start's input.
	OutcomeSuperseded Outcome = "superseded"
	// OutcomeRestarted: the run had ended and the conflict policy said to
	// start a new one under the same run ID (StartNew); the handle is the
	// new run's. Its step IDs differ from the old run's.
	OutcomeRestarted Outcome = "restarted"
)

// RunStatus is a run's lifecycle state; its Terminal reports whether it is
// final.
type RunStatus = jetflowtype.RunStatus

// RunBlock says why a run is blocked, where and since when; Divergence is
// its report (jetflowtype documents the kinds).
type (
	RunBlock       = jetflowtype.RunBlock
	Divergence     = jetflowtype.Divergence
	DivergenceKind = jetflowtype.DivergenceKind
	DivergedStep   = jetflowtype.DivergedStep
)

// Run states; all but running and blocked are final. A blocked run has
// not ended: its body diverged from its history after a change of code,
// and it runs no step until compatible code takes it or an operator
// unblocks it (Run.Block, Client.UnblockRun).
const (
	StatusRunning   = jetflowtype.StatusRunning
	StatusBlocked   = jetflowtype.StatusBlocked
	StatusCompleted = jetflowtype.StatusCompleted
	StatusFailed    = jetflowtype.StatusFailed
	StatusCancelled = jetflowtype.StatusCancelled
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Name identifies this client in the duplicate audit (default "go-sdk").
	Name string
	// Topology must match the workers'.
	Topology Topology
	// RequestTimeout bounds StartByName's request to a worker (default 10s).
	RequestTimeout time.Duration
	// Metrics counts the starts this client admits itself (Start; nil:
	// none). StartByName starts are counted by the worker that admits them.
	Metrics *Metrics
	// Tracing emits the jetflow.start span of the starts this client
	// admits itself, and the jetflow.run span of the runs it cancels (nil:
	// none); see WithTracerProvider. Every start carries the trace context
	// of its ctx into the run, traced or not.
	Tracing *Tracing
	// StartByRequest makes Start ask a worker that serves the workflow to
	// admit the start (request-reply on jetflow.admit.<workflow>, as
	// StartByName does) instead of admitting it in this process. It is for
	// a producer whose NATS user may not write the runs bucket or publish
	// tasks, such as jetflow_producer in deploy/nats/accounts.conf: such a
	// user can still read what Handle.Result and WaitRun need.
	//
	// Start keeps its contract (idempotent on the run ID, the same Handle
	// and outcomes); what differs: a workflow no worker serves is an error
	// at once (in-process, the start would wait for a worker): a
	// *NoWorkerError (ErrUnavailable) when none runs now and one may
	// (the workflow is known, or no worker of the deployment runs at
	// all), ErrUnknownWorkflow when workers run and none ever served it;
	// RequestTimeout bounds a start whose ctx has no deadline; a
	// conflict or a rejection matches ErrIdempotencyConflict or
	// ErrDuplicateRejected with errors.Is but is not a *ConflictError or
	// *RejectedError; and a run that expired while it was being started is
	// ErrUnavailable (retry with the same run ID), not ErrRetryStart. The
	// worker counts the start in its metrics (entry point "sdk").
	StartByRequest bool
}

// Client starts runs and reads them. It is safe for concurrent use.
type Client struct {
	nc     *nats.Conn
	cfg    ClientConfig
	assets *jetstream.Assets
	// engine holds the client's run store (runs), admitter (admit) and
	// the cancel path (cancels), shared with nothing else.
	engine
	// denials fails a cancel at once when the server refuses its writes.
	denials denials
	// noIndexRepair: the server refused this client's repair of the run
	// index (ListRuns); it does not try again.
	noIndexRepair atomic.Bool
}

// NewClient binds to the engine's streams and buckets on nc, creating any
// that are missing (it never changes existing ones: workers own the
// deployment's settings), and returns a client. The connection stays the
// caller's to close.
//
// Like every method of Client, it reports a transient NATS condition (NATS
// down or reconnecting, a timeout, JetStream unavailable) as an error that
// matches ErrUnavailable: retry later, with the same run ID for a start.
func NewClient(ctx context.Context, nc *nats.Conn, cfg ClientConfig) (_ *Client, err error) {
	if err := checkConn(nc); err != nil {
		return nil, err
	}
	defer func() { err = jetstream.Unavailable(err) }()
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	assets, err := jetstream.Provision(ctx, nc, cfg.Topology, jetstream.Ensure)
	if err != nil {
		return nil, err
	}
	cfg.Metrics.watch(nc)
	eng := newEngine(assets, cfg.Metrics.internal(), cfg.Tracing.internal(), defaultLogger(), true)
	return &Client{nc: nc, cfg: cfg, assets: assets, engine: eng}, nil
}

// WithDefaults returns c with every unset field at its default, as
// NewClient uses it.
func (c ClientConfig) WithDefaults() ClientConfig {
	if c.Name == "" {
		c.Name = "go-sdk"
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 10 * time.Second
	}
	return c
}

// validate refuses a configuration NewClient cannot work with, before it
// touches NATS. (The topology is Provision's to check.)
func (c ClientConfig) validate() error {
	if c.RequestTimeout < 0 {
		return fmt.Errorf("jetflow: client config: RequestTimeout must not be negative, got %s", c.RequestTimeout)
	}
	return nil
}

// Ready reports whether the client can start and read runs: connected to
// NATS, with the engine's runs and steps buckets present. A nil error means
// ready. It is what a readiness probe of a service that starts runs should
// call.
func (c *Client) Ready(ctx context.Context) error {
	return jetstream.Unavailable(ready(ctx, c.nc, c.assets, nil))
}

// StartOption configures one start.
type StartOption func(*startOptions)

type startOptions struct {
	runID       string
	runIDSet    bool // WithRunID was given, even with ""
	generateID  bool // WithGeneratedRunID
	source      string
	ignoreInput bool
	policy      *ConflictPolicy
	attributes  map[string]string
	// entry labels the starts metric: the entry point ctx names (a
	// gateway's; see internal/entry), "" for the default.
	entry entry.Point
	// rerunOf makes the request a rerun of that run (Client.Rerun): the
	// worker takes the input from it.
	rerunOf *startproto.RerunOf
	// err is the first option that was invalid.
	err error
}

// WithRunID sets the run ID: the caller's idempotency key, such as
// "order-o-1" for order o-1 (1..128 characters of [A-Za-z0-9_=-]).
// Every start needs it or WithGeneratedRunID: a start with neither is
// ErrRunIDRequired, and WithRunID("") is ErrInvalidRunID, never a
// generated ID (an unset variable must not start a new run on each retry).
func WithRunID(id string) StartOption {
	return func(o *startOptions) { o.runID, o.runIDSet = id, true }
}

// WithGeneratedRunID asks for a unique generated run ID: the start always
// creates a new run, so a retry of it is not deduplicated. It excludes
// WithRunID, and a workflow defined with RequireRunID refuses it
// (ErrRunIDRequired). The handle's RunID is the generated ID.
func WithGeneratedRunID() StartOption { return func(o *startOptions) { o.generateID = true } }

// checkRunID checks a start's run ID options: a valid WithRunID, or
// WithGeneratedRunID where the workflow allows it.
func (o startOptions) checkRunID(workflow string, requireRunID bool) error {
	switch {
	case o.generateID && o.runIDSet:
		return fmt.Errorf("%w: WithRunID and WithGeneratedRunID exclude each other", ErrInvalidRunID)
	case o.generateID && requireRunID:
		return fmt.Errorf("%w: workflow %s refuses a generated run ID", ErrRunIDRequired, workflow)
	case o.generateID:
		return nil
	case !o.runIDSet:
		return fmt.Errorf("%w: start %s with WithRunID (your idempotency key) or WithGeneratedRunID", ErrRunIDRequired, workflow)
	}
	return state.ValidateRunID(o.runID)
}

// WithAttributes attaches business attributes to the run — the order,
// customer or account it is about — so that ListRuns (ListOptions.
// Attributes), GET /v1/runs?attr.<name>=<value>, producer list --attr and
// the inspector find it by them. A run carries at most 8; a name is
// [a-z][a-z0-9_]{0,31}, a value 1..64 bytes of printable UTF-8. A set
// outside these limits fails the start with ErrInvalidAttributes before
// anything is published or stored. Attributes are metadata: they are not
// part of the input's fingerprint, and a duplicate start keeps the first
// start's attributes (its own are ignored). Given twice, the last set
// counts.
func WithAttributes(attrs map[string]string) StartOption {
	return func(o *startOptions) { o.attributes = maps.Clone(attrs) }
}

// WithSource overrides the client name recorded in the audit for this start.
func WithSource(source string) StartOption { return func(o *startOptions) { o.source = source } }

// startOpts applies opts; an option that refused its argument is the
// error. What the options carry is checked once, where the start is
// admitted (dedupe.Validate in this process, or in the worker that admits a
// requested start, which requestStart checks before it sends).
func (c *Client) startOpts(ctx context.Context, opts []StartOption) (startOptions, error) {
	o := startOptions{source: c.cfg.Name, entry: entry.From(ctx)}
	for _, opt := range opts {
		opt(&o)
	}
	return o, o.err
}

// Handle is the result of a start: which run, and what the start did.
type Handle[R any] struct {
	// RunID identifies the run, the same for every start with this ID.
	RunID string
	// Outcome is OutcomeCreated for exactly one start of a run ID, and
	// OutcomeExisting for every other one, except that a start which the
	// conflict policy lets replace an ended run (StartNew) gets
	// OutcomeRestarted, and one that replaces a running run (Supersede)
	// OutcomeSuperseded, exactly one per replaced run.
	Outcome Outcome
	// Status is the run's state when the start returned.
	Status RunStatus
	// Duplicates is how many duplicate starts the run has absorbed,
	// counting this one when Outcome is OutcomeExisting.
	Duplicates int64
	// AfterExpiry is set with OutcomeCreated when a run with this run ID
	// existed and was forgotten because its retention passed: this is a
	// new run, not a duplicate of that one.
	AfterExpiry bool
	// Generation is the generation of the run this start created or got
	// (see StartNew and Supersede; a run ID's first run has 0, or a higher
	// number when an expired run had the ID before).
	Generation int

	client *Client
	// anyGeneration: the generation is unknown (the answer of a worker
	// that did not send it), so Result waits for whichever one runs.
	anyGeneration bool
	// since is the revision of the run's record the start saw running (0:
	// none): Result's wait starts from it (runs.Store.WaitGeneration).
	since uint64

	// memo keeps the first final answer of Result, which later calls
	// repeat (a pointer, so that a copy of the Handle shares it).
	memo *handleMemo[R]
}

// handleMemo is the first final answer of Handle.Result.
type handleMemo[R any] struct {
	mu   sync.Mutex
	done bool
	out  R
	err  error
}

// Start starts a run of wf with input, or returns the run that already has
// the run ID. It needs WithRunID, or WithGeneratedRunID for a new run each
// time (ErrRunIDRequired otherwise). It is idempotent on the run ID: any number of
// calls, concurrent or retried, from any number of processes, at any time
// within the retention, create exactly one run; every call returns its
// handle, and exactly one of them says OutcomeCreated. A duplicate is not an
// error. The stored input of an existing run is kept: a duplicate with
// another input does not change it.
//
// A start returns once the run is durably accepted; the run is executed by a
// worker that serves wf, whenever one is running. A client with
// ClientConfig.StartByRequest has a worker admit the start instead, for
// NATS users that may not write the runs bucket.
func Start[P, R any](ctx context.Context, c *Client, wf *Workflow[P, R], input P, opts ...StartOption) (_ *Handle[R], err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	raw, err := json.Marshal(input)
	if err != nil {
		return nil, fmt.Errorf("%w: encode input of %s: %w", ErrInvalidInput, wf.Name(), err)
	}
	o, err := c.startOpts(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := o.checkRunID(wf.Name(), wf.requireRunID); err != nil {
		return nil, err
	}
	if o.generateID {
		o.runID = nuid.Next()
	}
	policy := wf.policy
	if o.policy != nil {
		policy = *o.policy
	}
	if c.cfg.StartByRequest {
		return startByRequest[R](ctx, c, wf.Name(), wf.retention, raw, o, policy)
	}
	res, err := c.admit.Admit(ctx, dedupe.Request{
		RunID: o.runID, Workflow: wf.Name(), Input: raw, Source: o.source,
		IgnoreInput: o.ignoreInput, Policy: policy, Retention: wf.retention,
		Entry: string(o.entry), Attributes: o.attributes,
	})
	if err != nil {
		return nil, err
	}
	h := &Handle[R]{
		RunID: res.Run.RunID, Outcome: outcome(res.Outcome), Status: RunStatus(res.Run.Status),
		Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry, Generation: res.Run.Generation, client: c,
		memo: &handleMemo[R]{},
	}
	if res.Stored && res.Run.Status.Active() {
		h.since = res.Revision
	}
	return h, nil
}

func outcome(o dedupe.Outcome) Outcome {
	switch o {
	case dedupe.Created:
		return OutcomeCreated
	case dedupe.Restarted:
		return OutcomeRestarted
	case dedupe.Superseded:
		return OutcomeSuperseded
	case dedupe.Existing:
		return OutcomeExisting
	default:
		return Outcome(o.String())
	}
}

// derefInt is *p, or 0 for nil.
func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// startByRequest is Start by request-reply to a worker that serves
// workflow (ClientConfig.StartByRequest). The run ID, generated or not, is
// set; the policy sent is the one Start admits with in process.
func startByRequest[R any](ctx context.Context, c *Client, workflow string, retention time.Duration, input json.RawMessage, o startOptions, policy ConflictPolicy) (*Handle[R], error) {
	if max := c.assets.Topology.Retention; retention > max {
		return nil, fmt.Errorf("%w: retention %s is longer than the deployment's %s", ErrInvalidRetention, retention, max)
	}
	o.generateID = false // generated here, as in process: the request names it
	o.policy = &policy
	if o.entry == "" {
		o.entry = entry.SDK
	}
	res, err := c.requestStart(ctx, workflow, input, o)
	if err != nil {
		return nil, err
	}
	return &Handle[R]{
		RunID: res.RunID, Outcome: res.Outcome, Status: res.Status,
		Duplicates: res.Duplicates, AfterExpiry: res.AfterExpiry, Generation: res.Generation, client: c,
		anyGeneration: !res.generationKnown, memo: &handleMemo[R]{},
	}, nil
}

// Result waits until the run ends and returns its typed output, or a
// *RunError if it failed. Its first final answer (an output, a run error,
// ErrRunReplaced, ErrRunNotFound or ErrMalformed) is kept: calling it
// again returns the same. An ended ctx or a NATS error is not final: a
// later call waits again.
//
// It waits for the generation the start created or got (Generation). A
// generation cancelled by a superseding start ends with a *RunError whose
// Code is CodeSuperseded; but once a newer generation has replaced it
// (Supersede while it runs, or StartNew after it ended) the record holds
// the newer one, and Result returns an error matching ErrRunReplaced,
// since the replaced generation's outcome is no longer kept. WaitRun, by
// run ID, waits for whichever generation runs.
func (h *Handle[R]) Result(ctx context.Context) (R, error) {
	m := h.memo
	if m == nil { // a Handle not made by a start
		out, err, _ := h.result(ctx)
		return out, err
	}
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if !done {
		out, err, final := h.result(ctx) // not under mu: concurrent calls wait each with its own ctx
		if !final {
			return out, err
		}
		m.mu.Lock()
		if !m.done { // the first final answer is kept
			m.out, m.err, m.done = out, err, true
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.out, m.err
}

// result waits for the handle's generation and says whether its answer is
// final.
func (h *Handle[R]) result(ctx context.Context) (out R, err error, final bool) {
	if err := state.ValidateRunID(h.RunID); err != nil {
		return out, err, true
	}
	var r state.Run
	if h.anyGeneration {
		r, err = h.client.runs.Wait(ctx, h.RunID)
	} else {
		r, err = h.client.runs.WaitGeneration(ctx, h.RunID, h.Generation, h.since)
	}
	if errors.Is(err, runs.ErrNotFound) {
		return out, fmt.Errorf("%w: %s", ErrRunNotFound, h.RunID), true
	}
	if err != nil {
		return out, err, false // ctx's own error as it is, not ErrUnavailable
	}
	if !h.anyGeneration && r.Generation > h.Generation {
		return out, fmt.Errorf("%w: generation %d of run %s was replaced by generation %d (a superseding start, or a start again after it ended); its outcome is not kept",
			ErrRunReplaced, h.Generation, h.RunID, r.Generation), true
	}
	if r.Error != nil {
		return out, runErrorFrom(r.RunID, RunStatus(r.Status), r.Error), true
	}
	if err := json.Unmarshal(r.Output, &out); err != nil {
		return out, fmt.Errorf("%w: output of run %s does not decode into %T: %w", ErrMalformed, h.RunID, out, err), true
	}
	return out, nil, true
}

// StartResult is the untyped result of StartByName: the fields of Handle,
// and the workflow. Its JSON encoding is what the producer's
// --output json prints for a start.
type StartResult struct {
	RunID    string    `json:"run_id"`
	Workflow string    `json:"workflow"`
	Outcome  Outcome   `json:"outcome"`
	Status   RunStatus `json:"status"`
	// Duplicates, AfterExpiry and Generation are as in Handle.
	Duplicates  int64 `json:"duplicates"`
	AfterExpiry bool  `json:"after_expiry,omitempty"`
	Generation  int   `json:"generation,omitempty"`

	// generationKnown: the answering worker sent the generation (one of an
	// earlier version does not).
	generationKnown bool
}

// StartByName starts a run of the workflow called name with JSON input, by
// asking a worker that serves it, so that an unknown workflow name
// (ErrUnknownWorkflow: workers of this deployment run and none has ever
// served it), an input the workflow cannot decode (ErrInvalidInput) or an
// invalid run ID (ErrInvalidRunID) is reported before anything is stored.
// A known workflow that no worker serves now, and any workflow while no
// worker of the deployment runs (none has reported yet, or all are down),
// is a *NoWorkerError, which matches ErrUnavailable: retry later with the
// same run ID. As for Start, it needs WithRunID or WithGeneratedRunID.
// Repeat calls behave as Start's.
func (c *Client) StartByName(ctx context.Context, name string, input json.RawMessage, opts ...StartOption) (_ StartResult, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateName(name); err != nil {
		return StartResult{}, err
	}
	o, err := c.startOpts(ctx, opts)
	if err != nil {
		return StartResult{}, err
	}
	// A generated ID is the worker's to make, and to refuse (RequireRunID).
	if err := o.checkRunID(name, false); err != nil {
		return StartResult{}, err
	}
	return c.requestStart(ctx, name, input, o)
}

// requestStart asks a worker that serves the workflow name to admit a
// start (jetflow.admit.<name>) and decodes its reply, errors into their
// sentinels (replyError). The run ID options o are checked.
func (c *Client) requestStart(ctx context.Context, name string, input json.RawMessage, o startOptions) (StartResult, error) {
	if o.rerunOf != nil {
		input = json.RawMessage("null") // the worker takes the rerun source's
	}
	// Checked before the request goes out, as the worker will.
	if o.policy != nil {
		if err := dedupe.ValidatePolicy(*o.policy); err != nil {
			return StartResult{}, err
		}
	}
	if err := state.ValidateAttributes(o.attributes); err != nil {
		return StartResult{}, err
	}
	if !json.Valid(input) {
		return StartResult{}, fmt.Errorf("%w: input is not valid JSON", ErrInvalidInput)
	}
	if len(input) > state.MaxInputBytes {
		return StartResult{}, fmt.Errorf("%w: %d bytes, limit %d", ErrInputTooLarge, len(input), state.MaxInputBytes)
	}
	if err := state.ValidateSource(o.source); err != nil {
		return StartResult{}, err
	}
	sr := startproto.StartRequest{RunID: o.runID, GenerateRunID: o.generateID, Input: input, Source: o.source, Attributes: o.attributes,
		RerunOf: o.rerunOf}
	if o.ignoreInput {
		sr.Fingerprint = "ignore"
	}
	if o.policy != nil {
		p, err := dedupe.EnvelopeFromPolicy(*o.policy)
		if err != nil {
			return StartResult{}, err
		}
		sr.Policy = &p
	}
	body, err := state.Encode(sr)
	if err != nil {
		return StartResult{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	req := nats.NewMsg(startproto.AdmitSubjectPrefix + name)
	req.Data = body
	if o.entry != "" {
		req.Header.Set(startproto.EntryHeader, string(o.entry))
	}
	tracing.InjectNATS(ctx, req.Header)
	msg, err := c.nc.RequestMsgWithContext(ctx, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return StartResult{}, c.unanswered(ctx, name)
	}
	if err != nil {
		return StartResult{}, fmt.Errorf("jetflow: start %s: %w", name, err)
	}
	var reply startproto.StartReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return StartResult{}, fmt.Errorf("%w: start reply: %w", ErrMalformed, err)
	}
	if reply.Error != nil {
		if c := reply.Error.Conflict; c != nil && reply.Error.Code == startproto.CodeConflict && reply.RunID != "" {
			// The worker's *ConflictError, as Start returns it in process.
			return StartResult{}, c.ConflictError(reply.RunID)
		}
		if reply.Error.Code == startproto.CodeRejected && reply.RunID != "" && reply.Status != "" {
			// The worker's *RejectedError, as Start returns it in process.
			return StartResult{}, &RejectedError{RunID: reply.RunID, Status: RunStatus(reply.Status)}
		}
		return StartResult{}, replyError(reply.Error)
	}
	return StartResult{
		RunID: reply.RunID, Workflow: reply.Workflow, Outcome: Outcome(reply.Outcome),
		Status: RunStatus(reply.Status), Duplicates: reply.Duplicates, AfterExpiry: reply.AfterExpiry,
		Generation: derefInt(reply.Generation), generationKnown: reply.Generation != nil,
	}, nil
}

// unanswered is the error of a start of workflow name that no worker
// answered ("no responders"), told apart by the deployment's record of
// the workflows it has served and of the workers that run now
// (internal/roster), read in one request: a *NoWorkerError (ErrNoWorker
// and ErrUnavailable: retry later) for a known workflow whose workers are
// all gone now, and for any name while no worker of the deployment runs
// (none has reported yet, as in a fresh deployment whose workers start
// after the producer, or all are down): then a name no worker served yet
// may be one whose workers are still to come. ErrUnknownWorkflow only for
// a name no worker ever served while workers of the deployment run. A
// record that cannot be read is ErrUnavailable, never "unknown"; so is
// one the connection's user may not read (deploy/nats/accounts.conf
// before the liveness read), reported at once rather than at the end of
// ctx.
func (c *Client) unanswered(ctx context.Context, name string) error {
	rctx, stop := c.denials.watch(ctx, c.nc, rosterRead)
	st, err := roster.Read(rctx, c.assets.Workflows, name, time.Now())
	stop()
	if cause := context.Cause(rctx); err != nil && errors.Is(cause, ErrPermissionDenied) {
		err = fmt.Errorf("%v (it needs %s; the known record alone tells nothing while no worker runs)", cause, rosterRead)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: no worker answered for workflow %q, and whether it is known could not be read: %w", ErrUnavailable, name, err)
	case st.Found:
		return &NoWorkerError{Workflow: name, FirstServed: st.Known.FirstServed, FirstWorker: st.Known.FirstWorker}
	case st.Live == 0:
		return &NoWorkerError{Workflow: name}
	}
	return fmt.Errorf("%w: no worker serves %q, and none ever has", ErrUnknownWorkflow, name)
}

// rosterRead is the subject of the roster's batch read (roster.Read): a
// direct get on the workflows bucket's stream, without a subject.
const rosterRead = "$JS.API.DIRECT.GET.KV_" + jetstream.WorkflowsBucket

// replyCodes maps the error codes of a start reply to the sentinels they
// stand for.
var replyCodes = map[string]error{
	startproto.CodeInvalidRunID:   ErrInvalidRunID,
	startproto.CodeInvalidInput:   ErrInvalidInput,
	startproto.CodeTooLarge:       ErrInputTooLarge,
	startproto.CodeMalformed:      ErrMalformed,
	startproto.CodeConflict:       ErrIdempotencyConflict,
	startproto.CodeRejected:       ErrDuplicateRejected,
	startproto.CodeBadPolicy:      ErrInvalidConflictPolicy,
	startproto.CodeRunIDNeeded:    ErrRunIDRequired,
	startproto.CodeBadAttrs:       ErrInvalidAttributes,
	startproto.CodeRunNotFound:    ErrRunNotFound,
	startproto.CodeRunNotEnded:    ErrRunNotEnded,
	startproto.CodeStepNotReached: ErrStepNotReached,
}

func replyError(e *startproto.ReplyError) error {
	if e.Code == startproto.CodeInternal {
		// NATS failed on the worker during admission: retry with the same
		// run ID (docs/protocol.md).
		return fmt.Errorf("%w: start failed on the worker: %s", ErrUnavailable, e.Message)
	}
	base, ok := replyCodes[e.Code]
	if !ok {
		return fmt.Errorf("jetflow: start failed on the worker: %s", e.Message)
	}
	return &remoteError{base: base, msg: e.Message}
}

// remoteError is an error a worker reported: its text as the worker wrote
// it (which already names the sentinel), matching the sentinel with
// errors.Is.
type remoteError struct {
	base error
	msg  string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.base }

// Run is a run as stored. Its JSON encoding is the run as the HTTP API
// and the producer's --output json show it (snake_case names; a field is
// only ever added, never renamed or removed).
type Run struct {
	RunID    string    `json:"run_id"`
	Workflow string    `json:"workflow"`
	Status   RunStatus `json:"status"`
	// Source is the client name or envelope source of the start that
	// created the run.
	Source    string    `json:"source,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Generation counts the runs started again under this run ID by the
	// conflict policy (0 for the first).
	Generation int `json:"generation"`
	// Duplicates is how many duplicate starts the run ID has seen (absorbed,
	// refused, or that started it again); FirstDuplicate and
	// RecentDuplicates (the last few, oldest first) describe them.
	Duplicates       int64              `json:"duplicates"`
	FirstDuplicate   *DuplicateAttempt  `json:"first_duplicate,omitempty"`
	RecentDuplicates []DuplicateAttempt `json:"recent_duplicates,omitempty"`
	// Input, Output and Error are the run's JSON input, its output once
	// completed, and why it did not complete (its JSON has only kind and
	// message: the run ID and status are the run's own fields).
	Input  json.RawMessage `json:"input,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  *RunError       `json:"error,omitempty"`
	// Parent is the run that started this one as its child (Child); nil
	// for a run started from outside.
	Parent *RunLink `json:"parent,omitempty"`
	// Children are the child runs this run started, in the order their
	// starts were recorded.
	Children []RunLink `json:"children,omitempty"`
	// Attributes are the business attributes the run was started with
	// (WithAttributes).
	Attributes map[string]string `json:"attributes,omitempty"`
	// Build is the build identity of the worker that started the run (the
	// first to park or end it); a pinned workflow's run runs only on
	// workers of this build (WithVersioning). Empty while not recorded.
	Build string `json:"build,omitempty"`
	// Block says why a blocked run (Status StatusBlocked) is blocked: the
	// divergence of its code from its history, where, and which build's
	// code it was. Nil for a run that is not blocked.
	Block *RunBlock `json:"block,omitempty"`
	// Waived are the steps of the run's history that an operator told the
	// run to go on without (UnblockRun with AcceptDivergence): their
	// records are kept, and the code's steps at their places ran again.
	Waived []string `json:"waived,omitempty"`
	// RerunOf is the run this one reruns (Client.Rerun): its committed
	// steps before From are this run's too. Nil for any other run.
	RerunOf *RerunOf `json:"rerun_of,omitempty"`
	// Reruns are the runs started as reruns of this one, oldest first
	// (the last ten).
	Reruns []RerunRef `json:"reruns,omitempty"`
}

// RerunOf is what a rerun knows of its source run.
type RerunOf struct {
	RunID      string `json:"run_id"`
	Generation int    `json:"generation,omitempty"`
	// From is the source's step ID of the first step run again.
	From string `json:"from"`
}

// RerunRef is one rerun of a run, from the run's audit.
type RerunRef struct {
	At         time.Time `json:"at"`
	RunID      string    `json:"run_id"`
	Generation int       `json:"generation,omitempty"`
	From       string    `json:"from"`
	Source     string    `json:"source,omitempty"`
}

// RunLink links a parent run and a child run: the other run, and the
// parent's step that stands for the child.
type RunLink struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	StepID   string `json:"step_id"`
	// Detached: the child is not cancelled with its parent.
	Detached bool `json:"detached,omitempty"`
}

// DuplicateAttempt is one duplicate start of a run, from its audit.
type DuplicateAttempt struct {
	At time.Time `json:"at"`
	// Source is the client name (ClientConfig.Name, WithSource) or the
	// envelope's source.
	Source string `json:"source,omitempty"`
	// Outcome is "existing" (absorbed), "conflict" (another workflow or
	// input), "rejected" (by the conflict policy), "restarted" (the run
	// had ended and a new one was started) or "superseded" (the running
	// generation was cancelled and a new one started).
	Outcome string `json:"outcome"`
	// FingerprintMatch is whether workflow and input matched the run's.
	FingerprintMatch bool `json:"fingerprint_match"`
	// Status is the run's state the attempt saw.
	Status RunStatus `json:"status,omitempty"`
	// Generation is the generation the attempt was answered with: the one
	// it started (restarted, superseded) or the one it got.
	Generation int `json:"generation,omitempty"`
}

func toAttempt(e state.AuditEntry) DuplicateAttempt {
	return DuplicateAttempt{At: e.At, Source: e.Source, Outcome: e.Outcome, FingerprintMatch: e.FingerprintMatch,
		Status: RunStatus(e.Status), Generation: e.Generation}
}

// GetRun reads a run, or returns ErrRunNotFound.
func (c *Client) GetRun(ctx context.Context, runID string) (_ Run, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	if err := state.ValidateRunID(runID); err != nil {
		return Run{}, err
	}
	r, _, err := c.runs.Get(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return Run{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return Run{}, err
	}
	return c.toRun(ctx, r)
}

// toRun is the stored record r with its duplicate audit.
func (c *Client) toRun(ctx context.Context, r state.Run) (Run, error) {
	audit, err := c.runs.Audit(ctx, r.RunID)
	if err != nil {
		return Run{}, err
	}
	run := Run{
		RunID: r.RunID, Workflow: r.Workflow, Status: RunStatus(r.Status), Input: r.Input,
		Output: r.Output, Source: r.Source, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
		Generation: r.Generation, Duplicates: audit.Duplicates, Attributes: r.Attributes,
		Block: r.Block, Waived: r.Waived, Build: r.Build,
	}
	if audit.First != nil {
		first := toAttempt(*audit.First)
		run.FirstDuplicate = &first
	}
	for _, e := range audit.Recent {
		run.RecentDuplicates = append(run.RecentDuplicates, toAttempt(e))
	}
	if r.Error != nil {
		run.Error = runErrorFrom(r.RunID, run.Status, r.Error)
	}
	if p := r.Parent; p != nil {
		run.Parent = &RunLink{RunID: p.RunID, Workflow: p.Workflow, StepID: p.StepID, Detached: p.Detached}
	}
	for _, c := range r.Children {
		run.Children = append(run.Children, RunLink{RunID: c.RunID, Workflow: c.Workflow, StepID: c.StepID, Detached: c.Detached})
	}
	if l := r.Rerun; l != nil {
		run.RerunOf = &RerunOf{RunID: l.RunID, Generation: l.Generation, From: l.From}
	}
	for _, e := range audit.Reruns {
		run.Reruns = append(run.Reruns, RerunRef{At: e.At, RunID: e.RunID, Generation: e.Generation, From: e.From, Source: e.Source})
	}
	return run, nil
}

// WaitRun waits until the run reaches a final state and returns it. It
// returns ErrRunNotFound if the run does not exist when the wait begins,
// and ctx's error (not ErrUnavailable) if ctx ends while it waits.
func (c *Client) WaitRun(ctx context.Context, runID string) (Run, error) {
	r, err := c.waitRecord(ctx, runID)
	if err != nil {
		return Run{}, err
	}
	run, err := c.toRun(ctx, r)
	if ctx.Err() != nil && err != nil {
		return Run{}, ctx.Err() // ctx's own error, never a retryable one
	}
	return run, jetstream.Unavailable(err)
}

// waitRecord is WaitRun without the duplicate audit: the final record.
func (c *Client) waitRecord(ctx context.Context, runID string) (state.Run, error) {
	if err := state.ValidateRunID(runID); err != nil {
		return state.Run{}, err
	}
	r, err := c.runs.Wait(ctx, runID)
	if errors.Is(err, runs.ErrNotFound) {
		return state.Run{}, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	return r, err // ctx's own error as it is, not ErrUnavailable
}

// CancelOutcome says what a cancel did.
type CancelOutcome struct {
	RunID string
	// Status is the run's state after the call: cancelled, or the state it
	// had ended in before (with ErrRunEnded).
	Status RunStatus
	// AlreadyCancelled is set when the run was cancelled before this call:
	// a repeat cancel changes nothing and says so.
	AlreadyCancelled bool
	// Children are the child runs cancelled with it, by this call or a
	// repeat of it (children started detached are not).
	Children []string
}

// CancelRun cancels a running run: its record becomes cancelled at once (a
// final state that no later completion overwrites; Result reports a
// *RunError with Status cancelled), workers are told to cancel the context
// of its running steps and body, and no step of it starts afterwards, even
// on a worker that missed the notice (every step reads the run's record
// before it starts). Its children are cancelled with it, except those
// started detached, and a cancelled child's parent sees it fail with a
// *StepError.
//
// A repeat call returns AlreadyCancelled, tells the workers and the parent
// again and cancels any child a failed earlier call left running; a run that completed or failed returns
// ErrRunEnded with its status; an unknown one ErrRunNotFound.
//
// A cancel writes run and step records and publishes tasks, which a
// least-privilege user may not (deploy/nats/accounts.conf: it needs
// jetflow_operator). When the server refuses one of these writes the call
// fails at once with ErrPermissionDenied, naming the subject, instead of
// waiting for ctx to end: its first call on the client chains a handler
// onto the connection's error handler to hear the refusal.
func (c *Client) CancelRun(ctx context.Context, runID string) (out CancelOutcome, err error) {
	ctx, stop := c.denials.watch(ctx, c.nc, cancelWrites...)
	defer stop()
	defer func() {
		err = jetstream.Unavailable(deniedErr(ctx, err, "a cancel needs the NATS user jetflow_operator (deploy/nats/accounts.conf)"))
	}()
	if err := state.ValidateRunID(runID); err != nil {
		return CancelOutcome{}, err
	}
	return c.cancel(ctx, runID)
}

// cancelWrites are the subjects CancelRun publishes to: run records, the
// run's lease and the parent's step record, the parent's wake and the
// workers' notice.
var cancelWrites = []string{
	"$KV." + jetstream.RunsBucket + ".",
	"$KV." + jetstream.StepsBucket + ".",
	"jetflow.branch.", // jetstream.BranchSubject: a worker wakes the parent
	jetstream.CancelSubjectPrefix,
}
