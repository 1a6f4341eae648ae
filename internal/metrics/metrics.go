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
// # Nil safety
//
// Every method is a no-op on a nil *Metrics, so engine code calls them
// unconditionally and a process without metrics passes nil.
package metrics

import (
	"errors"
	"fmt"
	"strconv"
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
)

// names is every family in registration order; Names returns a copy.
var names = []string{
	NameStarts, NameSuppressed, NameSteps, NameStepDuration, NameRunsFinished,
	NameRunDuration, NameRedeliveries, NameMaxDeliveries, NameStepsInFlight,
	NameConsumerPending, NameConsumerAckPending, NameBacklogSampleErrors,
	NameHTTPRequests, NameHTTPDuration, NameRunsStuck, NameUnservedStarts,
}

// Names lists every metric family name this package exports, in a fixed
// order. Each call returns a fresh slice the caller may modify.
func Names() []string {
	return append([]string(nil), names...)
}

// ErrNilRegisterer is returned by New when it is given no registerer.
var ErrNilRegisterer = errors.New("metrics: nil prometheus.Registerer")

// Metrics owns every jetflow collector. Create it with New; a nil *Metrics
// is valid and records nothing. Its methods are safe for concurrent use.
type Metrics struct {
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

	backlog backlogState
}

// New creates every collector and registers it with reg. It registers all
// of them or none: when one fails, those already registered are
// unregistered again. A second New on the same registry fails with an
// error wrapping prometheus.AlreadyRegisteredError (match it with
// errors.As); a nil reg fails with ErrNilRegisterer.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	m := &Metrics{
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameStarts,
			Help: "Start decisions by entry point, outcome and the run's state.",
		}, []string{"entry", "outcome", "state"}),
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
	}
	collectors := []prometheus.Collector{
		m.starts, m.suppressed, m.steps, m.stepDuration, m.runsFinished,
		m.runDuration, m.redeliveries, m.maxDeliveries, m.inFlight,
		m.pending, m.ackPending, m.sampleErrors, m.httpRequests, m.httpDuration,
		m.runsStuck,
		m.unserved,
	}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("metrics: register %s: %w", names[i], err)
		}
	}
	return m, nil
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

// Start counts one start decision. outcome is one of created, existing,
// restarted, conflict, rejected, error; state is the run's state (running,
// completed, failed, cancelled), "" or "none" when unknown. Values outside
// those lists are counted as "other".
func (m *Metrics) Start(entry Entry, outcome, state string) {
	if m == nil {
		return
	}
	if state == "" {
		state = stateNone
	}
	m.starts.WithLabelValues(
		bounded(string(entry), entries),
		bounded(outcome, outcomes),
		bounded(state, startStates),
	).Inc()
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
