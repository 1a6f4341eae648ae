package jetflow

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetflow/jetflow/internal/metrics"
)

// Metrics is jetflow's Prometheus instrumentation: starts by outcome and
// entry point, duplicates suppressed by layer, steps by result with their
// durations, run durations and final states, redeliveries, dead-letter
// events, steps in flight and consumer backlogs. docs/operations.md lists
// every series. Labels never carry a run ID, step ID or key.
//
// Give the same *Metrics to every Client and Worker of a process
// (ClientConfig.Metrics, WorkerConfig.Metrics). A nil *Metrics records
// nothing.
type Metrics struct {
	m *metrics.Metrics
}

// NewMetrics registers jetflow's collectors on reg (for example a
// prometheus.NewRegistry() served by promhttp). A second NewMetrics on the
// same registry fails: its collectors are already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m, err := metrics.New(reg)
	if err != nil {
		return nil, err
	}
	return &Metrics{m: m}, nil
}

func (m *Metrics) internal() *metrics.Metrics {
	if m == nil {
		return nil
	}
	return m.m
}
