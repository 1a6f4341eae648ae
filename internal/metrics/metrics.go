// Package metrics owns every Prometheus collector jetflow exports.
//
// # Names
//
// The metric family names (see Names) are a contract with the Grafana
// dashboard and alert rules under deploy/: they never change silently.
//
// # Bounded labels
//
// No label ever carries a run ID, a key or a step ID. Labels whose values
// come from a fixed list (entry, outcome, state, layer, result) map any value
// outside that list to "other", so a caller bug cannot create unbounded
// series. Workflow and step names are defined in code by the registered
// workflows, so they are bounded by the program itself; callers must pass only
// names of registered workflows, never a name read from an unchecked message.
// HTTP routes are mux patterns (http.Request.Pattern), never raw paths.
//
// # Roles
//
// A worker exports every family (NewFor with RoleWorker); a process that only starts and
// reads runs exports the client's (NewFor with RoleClient, NamesFor), so
// that a producer is never counted as a worker.
//
// # Series at zero
//
// A counter series created at 1 shows no increase() or rate(), so an alert
// on a first event could not fire. Serve (called by a worker for the
// workflows it serves) and StepBegins create the series such alerts watch
// at 0; Start creates a workflow's failed starts at 0 at its first start
// through an entry point.
//
// # Nil safety
//
// Every method is a no-op on a nil *Metrics, so engine code calls them
// unconditionally and a process without metrics passes nil.
package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric family names, exactly as exported.
const (
	NameStarts              = "jetflow_starts_total"
	NameSuppressed          = "jetflow_duplicates_suppressed_total"
	NameSteps               = "jetflow_steps_total"
	NameStepDuration        = "jetflow_step_duration_seconds"
	NameRunsFinished        = "jetflow_runs_finished_total"
	NameRunDuration         = "jetflow_run_duration_seconds"
	NameRedeliveries        = "jetflow_redeliveries_total"
	NameMaxDeliveries       = "jetflow_max_deliveries_total"
	NameStepsInFlight       = "jetflow_steps_in_flight"
	NameConsumerPending     = "jetflow_consumer_pending"
	NameConsumerAckPending  = "jetflow_consumer_ack_pending"
	NameBacklogSampleErrors = "jetflow_consumer_sample_errors_total"
	NameHTTPRequests        = "jetflow_http_requests_total"
	NameHTTPDuration        = "jetflow_http_request_duration_seconds"
	NameRunsStuck           = "jetflow_runs_stuck_total"
	NameUnservedStarts      = "jetflow_unserved_start_envelopes"
	NameRunsRunning         = "jetflow_runs_running"
	NameEvents              = "jetflow_events_total"
	NameRunsBlocked         = "jetflow_runs_blocked_total"
	NameRunsBlockedNow      = "jetflow_runs_blocked"
	NameBuildInfo           = "jetflow_build_info"
	NameNATSConnected       = "jetflow_nats_connected"
	NameNATSReconnects      = "jetflow_nats_reconnects_total"
)

// Role is what a process does with jetflow, and so which series it
// exports: a producer must not export the worker's series, or dashboards
// would count it as a worker.
type Role string

// Roles.
const (
	// RoleWorker executes tasks and admits starts: every series.
	RoleWorker Role = "worker"
	// RoleClient starts, reads and cancels runs (a producer, the HTTP
	// API): starts, duplicates, runs finished (by cancel), HTTP, build and
	// NATS connection series, none of the worker's.
	RoleClient Role = "client"
)

// families is every family in registration order, with whether only a
// worker exports it.
var families = []struct {
	name       string
	workerOnly bool
}{
	{NameStarts, false}, {NameSuppressed, false}, {NameSteps, true}, {NameStepDuration, true},
	{NameRunsFinished, false}, {NameRunDuration, false}, {NameRedeliveries, true},
	{NameMaxDeliveries, true}, {NameStepsInFlight, true}, {NameConsumerPending, true},
	{NameConsumerAckPending, true}, {NameBacklogSampleErrors, true}, {NameHTTPRequests, false},
	{NameHTTPDuration, false}, {NameRunsStuck, true}, {NameUnservedStarts, true},
	{NameRunsRunning, true}, {NameEvents, true}, {NameRunsBlocked, true}, {NameRunsBlockedNow, true}, {NameBuildInfo, false}, {NameNATSConnected, false},
	{NameNATSReconnects, false},
}

// Names lists every metric family name this package exports, in a fixed
// order. Each call returns a fresh slice the caller may modify.
func Names() []string {
	return NamesFor(RoleWorker)
}

// NamesFor lists the families a process of role exports (a worker: all of
// them), in Names' order. Each call returns a fresh slice.
func NamesFor(role Role) []string {
	var out []string
	for _, f := range families {
		if role == RoleWorker || !f.workerOnly {
			out = append(out, f.name)
		}
	}
	return out
}

// ErrNilRegisterer is returned by NewFor when it is given no registerer.
var ErrNilRegisterer = errors.New("metrics: nil prometheus.Registerer")

// ErrUnknownRole is returned by NewFor for a role other than RoleWorker and
// RoleClient.
var ErrUnknownRole = errors.New("metrics: unknown role")

// Metrics owns every jetflow collector. Create it with NewFor; a nil *Metrics
// is valid and records nothing. Its methods are safe for concurrent use.
type Metrics struct {
	role          Role
	starts        *prometheus.CounterVec
	suppressed    *prometheus.CounterVec
	steps         *prometheus.CounterVec
	stepDuration  *prometheus.HistogramVec
	runsFinished  *prometheus.CounterVec
	runDuration   *prometheus.HistogramVec
	redeliveries  *prometheus.CounterVec
	maxDeliveries *prometheus.CounterVec
	inFlight      prometheus.Gauge
	pending       *prometheus.GaugeVec
	ackPending    *prometheus.GaugeVec
	sampleErrors  prometheus.Counter
	httpRequests  *prometheus.CounterVec
	httpDuration  *prometheus.HistogramVec
	runsStuck     *prometheus.CounterVec
	unserved      prometheus.Gauge
	runsRunning   *prometheus.GaugeVec
	events        *prometheus.CounterVec
	runsBlocked   *prometheus.CounterVec
	blockedNow    *prometheus.GaugeVec
	buildInfo     *prometheus.GaugeVec
	conns         *connCollector

	backlog backlogState
	// seen holds the label sets already initialised at zero (zeroKey).
	seen sync.Map
}

// NewFor creates the collectors a process of role exports (NamesFor) and
// registers them with reg. It registers all of them or none: when one
// fails, those already registered are unregistered again. A second NewFor
// on the same registry fails with an error wrapping
// prometheus.AlreadyRegisteredError (match it with errors.As); a nil reg
// fails with ErrNilRegisterer, another role with ErrUnknownRole.
//
// jetflow_build_info is set to 1 at once and the duplicate layers start at
// 0; every other series appears when it is first recorded or initialised
// (Serve, StepBegins).
func NewFor(reg prometheus.Registerer, role Role) (*Metrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	if role != RoleWorker && role != RoleClient {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRole, role)
	}
	m := &Metrics{
		role: role,
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameStarts,
			Help: "Start decisions by workflow, entry point, outcome and the run's state (outcome invalid: refused for the caller's mistake; error: the engine could not decide).",
		}, []string{"workflow", "entry", "outcome", "state"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameSuppressed,
			Help: "Duplicates stopped, by the first layer that stopped them.",
		}, []string{"layer"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameSteps,
			Help: "Step attempts by workflow, step and result.",
		}, []string{"workflow", "step", "result"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameStepDuration,
			Help:    "Duration of step attempts in seconds.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 17),
		}, []string{"workflow", "step"}),
		runsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRunsFinished,
			Help: "Runs that reached a final state.",
		}, []string{"workflow", "state"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameRunDuration,
			Help:    "Time from a run's creation to its final state in seconds.",
			Buckets: prometheus.ExponentialBucketsRange(0.01, 3600, 20),
		}, []string{"workflow", "state"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRedeliveries,
			Help: "Tasks delivered more than once.",
		}, []string{"workflow"}),
		maxDeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameMaxDeliveries,
			Help: "Tasks that hit the consumer's max deliveries (dead-letter events).",
		}, []string{"workflow"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: NameStepsInFlight,
			Help: "Tasks being executed now.",
		}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameConsumerPending,
			Help: "Messages not yet delivered to the consumer (sampled).",
		}, []string{"consumer"}),
		ackPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameConsumerAckPending,
			Help: "Messages delivered to the consumer and not yet acked (sampled).",
		}, []string{"consumer"}),
		sampleErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameBacklogSampleErrors,
			Help: "Failed samples of consumer backlogs.",
		}),
		httpRequests: newHTTPRequests(),
		httpDuration: newHTTPDuration(),
		runsStuck: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRunsStuck,
			Help: "Running runs found with no pending task or timer and dispatched again by the sweeper.",
		}, []string{"workflow"}),
		unserved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: NameUnservedStarts,
			Help: "Durable start envelopes waiting in JETFLOW_STARTS for workflows that no worker serves (no start consumer), as last sampled.",
		}),
		runsRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRunsRunning,
			Help: "Running runs of the workflow, as the worker's sweeper last read them from the runs bucket (every worker reports the same deployment-wide number: aggregate with max).",
		}, []string{"workflow"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameEvents,
			Help: "Event deliveries answered by this worker, by the run's workflow and outcome (delivered, duplicate, refused: a final error such as not found or conflict; error: a retryable failure).",
		}, []string{"workflow", "outcome"}),
		runsBlocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRunsBlocked,
			Help: "Runs a worker blocked because their code diverged from their history (a renamed, removed, reordered or retyped step), by workflow and kind of divergence: no step ran at the diverging place.",
		}, []string{"workflow", "divergence"}),
		blockedNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRunsBlockedNow,
			Help: "Blocked runs of the workflow (counted among jetflow_runs_running too), as the worker's sweeper last read them from the runs bucket (every worker reports the same number: aggregate with max).",
		}, []string{"workflow"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameBuildInfo,
			Help: "Always 1: the jetflow version, the Go version and the process's role (worker or client).",
		}, []string{"version", "goversion", "role"}),
		conns: newConnCollector(),
	}
	// One collector per family, in families' order; the connection
	// collector holds the last two.
	collectors := []prometheus.Collector{
		m.starts, m.suppressed, m.steps, m.stepDuration, m.runsFinished,
		m.runDuration, m.redeliveries, m.maxDeliveries, m.inFlight,
		m.pending, m.ackPending, m.sampleErrors, m.httpRequests, m.httpDuration,
		m.runsStuck, m.unserved, m.runsRunning, m.events, m.runsBlocked, m.blockedNow, m.buildInfo, m.conns,
	}
	var registered []prometheus.Collector
	for i, c := range collectors {
		f := families[i]
		if f.workerOnly && role != RoleWorker {
			continue
		}
		if err := reg.Register(c); err != nil {
			for _, done := range registered {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("metrics: register %s: %w", f.name, err)
		}
		registered = append(registered, c)
	}
	version, goVersion := buildVersion()
	m.buildInfo.WithLabelValues(version, goVersion, string(role)).Set(1)
	for l := range layers {
		m.suppressed.WithLabelValues(l)
	}
	return m, nil
}

// Role is the role m was created for; a nil *Metrics has none ("").
func (m *Metrics) Role() Role {
	if m == nil {
		return ""
	}
	return m.role
}

// Serve initialises at 0 every series of workflows whose first increment
// an alert must see (a counter created at 1 shows no increase() or rate()):
// max deliveries, redeliveries, stuck runs, runs finished in each final
// state, and failed starts (outcome error) through each entry point. A
// worker calls it with the workflows it serves; calling it again is
// harmless.
func (m *Metrics) Serve(workflows ...string) {
	if m == nil {
		return
	}
	for _, wf := range workflows {
		m.maxDeliveries.WithLabelValues(wf)
		m.redeliveries.WithLabelValues(wf)
		m.runsStuck.WithLabelValues(wf)
		m.blockedNow.WithLabelValues(wf)
		for st := range finalStates {
			m.runsFinished.WithLabelValues(wf, st)
		}
		for e := range entries {
			m.zeroStarts(wf, e)
		}
	}
}

// zeroStarts initialises the failed starts of workflow through entry at 0
// (once).
func (m *Metrics) zeroStarts(workflow, entry string) {
	if _, done := m.seen.LoadOrStore(zeroKey{NameStarts, workflow, entry}, true); !done {
		m.starts.WithLabelValues(workflow, entry, OutcomeError, stateNone)
	}
}

// StepBegins initialises the attempts of step in workflow at 0 for every
// result (once), so that the first failed or fatal attempt is an increase
// Prometheus can see. The executor calls it when an attempt starts; Step
// calls it too.
func (m *Metrics) StepBegins(workflow, step string) {
	if m == nil {
		return
	}
	if _, done := m.seen.LoadOrStore(zeroKey{NameSteps, workflow, step}, true); !done {
		for r := range stepResults {
			m.steps.WithLabelValues(workflow, step, r)
		}
	}
}

// zeroKey names a label set initialised at zero: a family and two label
// values.
type zeroKey struct{ family, a, b string }

// RunBlocked counts a run of workflow blocked by a divergence of kind.
func (m *Metrics) RunBlocked(workflow, kind string) {
	if m == nil {
		return
	}
	m.runsBlocked.WithLabelValues(workflow, kind).Inc()
}

// RunsBlockedNow sets how many runs of workflow are blocked, as last read.
func (m *Metrics) RunsBlockedNow(workflow string, n int) {
	if m == nil {
		return
	}
	m.blockedNow.WithLabelValues(workflow).Set(float64(n))
}

// RunsRunning sets how many runs of workflow are running, as last read.
func (m *Metrics) RunsRunning(workflow string, n int) {
	if m == nil {
		return
	}
	m.runsRunning.WithLabelValues(workflow).Set(float64(n))
}

// UnservedStarts sets how many durable start envelopes wait for workflows
// that no worker serves. The workflows themselves are logged, not labels:
// their names come from any publisher, so they are not bounded.
func (m *Metrics) UnservedStarts(envelopes uint64) {
	if m == nil {
		return
	}
	m.unserved.Set(float64(envelopes))
}

// Start counts one start decision of workflow (a registered workflow's
// name). outcome is one of created, existing, restarted, superseded,
// conflict, rejected, invalid (the caller's mistake), error (the engine's
// failure); state is the run's state (running, completed, failed,
// cancelled), "" or "none" when unknown. Values outside those lists are
// counted as "other". The first start of a workflow through an entry point
// also initialises its failed starts at 0.
func (m *Metrics) Start(entry Entry, workflow, outcome, state string) {
	if m == nil {
		return
	}
	if state == "" {
		state = stateNone
	}
	e := bounded(string(entry), entries)
	m.zeroStarts(workflow, e)
	m.starts.WithLabelValues(workflow, e, bounded(outcome, outcomes), bounded(state, startStates)).Inc()
}

// Event counts one event delivery answered for a run of workflow ("" when
// the run was not found) with outcome: delivered, duplicate, refused or
// error (anything else counts as "other"). A duplicate also counts as
// suppressed by LayerEvent.
func (m *Metrics) Event(workflow, outcome string) {
	if m == nil {
		return
	}
	m.events.WithLabelValues(workflow, bounded(outcome, eventOutcomes)).Inc()
	if outcome == EventDuplicate {
		m.Suppressed(LayerEvent)
	}
}

// Suppressed counts one duplicate stopped by layer, the first layer that
// stopped it.
func (m *Metrics) Suppressed(layer Layer) {
	if m == nil {
		return
	}
	m.suppressed.WithLabelValues(bounded(string(layer), layers)).Inc()
}

// Step counts one step attempt with its result and observes its duration
// (negative durations count as zero).
func (m *Metrics) Step(workflow, step string, r StepResult, d time.Duration) {
	if m == nil {
		return
	}
	m.StepBegins(workflow, step)
	m.steps.WithLabelValues(workflow, step, bounded(string(r), stepResults)).Inc()
	m.stepDuration.WithLabelValues(workflow, step).Observe(seconds(d))
}

// RunFinished counts a run reaching its final state (completed, failed or
// cancelled; anything else counts as "other") and observes d, the time
// from its creation to that state.
func (m *Metrics) RunFinished(workflow, state string, d time.Duration) {
	if m == nil {
		return
	}
	state = bounded(state, finalStates)
	m.runsFinished.WithLabelValues(workflow, state).Inc()
	m.runDuration.WithLabelValues(workflow, state).Observe(seconds(d))
}

// Redelivered counts a task of workflow delivered more than once.
func (m *Metrics) Redelivered(workflow string) {
	if m == nil {
		return
	}
	m.redeliveries.WithLabelValues(workflow).Inc()
}

// MaxDeliveries counts a task of workflow that hit max deliveries.
func (m *Metrics) MaxDeliveries(workflow string) {
	if m == nil {
		return
	}
	m.maxDeliveries.WithLabelValues(workflow).Inc()
}

// RunStuck counts a run of workflow that the sweeper found running with
// nothing left to advance it (no pending task, no timer) and dispatched
// again.
func (m *Metrics) RunStuck(workflow string) {
	if m == nil {
		return
	}
	m.runsStuck.WithLabelValues(workflow).Inc()
}

// InFlight adds delta (+1 when a task starts, -1 when it ends) to the
// number of tasks being executed now.
func (m *Metrics) InFlight(delta int) {
	if m == nil {
		return
	}
	m.inFlight.Add(float64(delta))
}

// HTTP counts one API request on route (the mux pattern, e.g.
// "POST /v1/workflows/{name}/runs"; "" counts as "other") answered with
// code, and observes its latency. Codes outside 100..599 count as "other".
func (m *Metrics) HTTP(route string, code int, d time.Duration) {
	if m == nil {
		return
	}
	observeHTTP(m.httpRequests, m.httpDuration, route, code, d)
}

// seconds converts d to seconds, clamping negative durations to zero.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

// statusCode is code as a label value, "other" outside 100..599.
func statusCode(code int) string {
	if code < 100 || code > 599 {
		return other
	}
	return strconv.Itoa(code)
}
