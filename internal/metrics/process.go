package metrics

import (
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// modulePath is jetflow's module, whose version jetflow_build_info reports.
const modulePath = "github.com/jetflow/jetflow"

// buildVersion returns jetflow's module version as built into this binary
// ("(devel)" when jetflow is the main module built from a work tree,
// "unknown" without build information) and the Go version.
func buildVersion() (version, goVersion string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", runtime.Version()
	}
	version = "unknown"
	if bi.Main.Path == modulePath {
		version = bi.Main.Version
	}
	for _, dep := range bi.Deps {
		if dep.Path == modulePath {
			version = dep.Version
			if dep.Replace != nil && dep.Replace.Version != "" {
				version = dep.Replace.Version
			}
		}
	}
	if version == "" {
		version = "unknown"
	}
	return version, runtime.Version()
}

// connCollector exports the state of the NATS connections attached with
// WatchConn: jetflow_nats_connected (1 when every one is connected) and
// jetflow_nats_reconnects_total (their reconnections, summed). Before a
// connection is attached it exports nothing, rather than a made-up state.
type connCollector struct {
	mu         sync.Mutex
	conns      map[any]conn
	connected  *prometheus.Desc
	reconnects *prometheus.Desc
}

// conn reads one connection's state.
type conn struct {
	connected  func() bool
	reconnects func() uint64
}

func newConnCollector() *connCollector {
	return &connCollector{
		conns: map[any]conn{},
		connected: prometheus.NewDesc(NameNATSConnected,
			"1 when the process's NATS connection is connected, 0 while it is disconnected, reconnecting or closed.", nil, nil),
		reconnects: prometheus.NewDesc(NameNATSReconnects,
			"Times the process's NATS connection reconnected.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connected
	ch <- c.reconnects
}

// Collect implements prometheus.Collector: it reads every attached
// connection at scrape time.
func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.conns) == 0 {
		return
	}
	up, total := 1.0, uint64(0)
	for _, cn := range c.conns {
		if !cn.connected() {
			up = 0
		}
		total += cn.reconnects()
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(total))
}

// WatchConn makes the NATS series report a connection: connected says
// whether it is connected now, reconnects how often it has reconnected
// (both read at each scrape). key identifies the connection (the
// *nats.Conn): attaching one key again replaces its functions, so a Client
// and a Worker sharing a connection count it once. A nil *Metrics or a nil
// function attaches nothing.
func (m *Metrics) WatchConn(key any, connected func() bool, reconnects func() uint64) {
	if m == nil || connected == nil || reconnects == nil {
		return
	}
	m.conns.mu.Lock()
	defer m.conns.mu.Unlock()
	m.conns.conns[key] = conn{connected: connected, reconnects: reconnects}
}
