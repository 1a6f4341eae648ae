package jetflow

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetflow/jetflow/internal/metrics"
)

// Metrics is jetflow's Prometheus instrumentation: starts by outcome and
// entry point, duplicates suppressed by layer, steps by result with their
// durations, run durations and final states, redeliveries, dead-letter
// events, steps in flight, consumer backlogs, running runs, the build and
// the NATS connection's state. docs/operations.md lists every series.
// Labels never carry a run ID, step ID or key.
//
// Give the same *Metrics to every Client and Worker of a process
// (ClientConfig.Metrics, WorkerConfig.Metrics). A nil *Metrics records
// nothing.
type Metrics struct {
	m *metrics.Metrics
}

// NewMetrics registers every jetflow collector on reg (for example a
// prometheus.NewRegistry() served by promhttp), for a process that runs a
// Worker. A second NewMetrics on the same registry fails: its collectors
// are already registered.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	return newMetrics(reg, metrics.RoleWorker)
}

// NewClientMetrics registers on reg only the collectors of a process that
// starts, reads and cancels runs but runs no Worker (a producer): starts,
// duplicates, runs cancelled, the build and the NATS connection, without
// the worker's series, so dashboards do not count the process as a
// worker. NewWorker refuses such a *Metrics (ErrClientMetrics).
func NewClientMetrics(reg prometheus.Registerer) (*Metrics, error) {
	return newMetrics(reg, metrics.RoleClient)
}

// ErrClientMetrics is NewWorker's answer to a WorkerConfig.Metrics made by
// NewClientMetrics: it lacks the worker's series, which would be lost.
var ErrClientMetrics = errors.New("jetflow: WorkerConfig.Metrics was made by NewClientMetrics, which has no worker series: use NewMetrics")

func newMetrics(reg prometheus.Registerer, role metrics.Role) (*Metrics, error) {
	m, err := metrics.NewFor(reg, role)
	if err != nil {
		return nil, err
	}
	return &Metrics{m: m}, nil
}

// watch makes the NATS connection series report nc.
func (m *Metrics) watch(nc *nats.Conn) {
	m.internal().WatchConn(nc, nc.IsConnected, func() uint64 { return nc.Stats().Reconnects })
}

func (m *Metrics) internal() *metrics.Metrics {
	if m == nil {
		return nil
	}
	return m.m
}
