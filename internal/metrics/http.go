package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func newHTTPRequests() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NameHTTPRequests,
		Help: "HTTP API requests by route pattern and status code.",
	}, []string{"route", "code"})
}

func newHTTPDuration() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: NameHTTPDuration,
		Help: "HTTP API request latency in seconds.",
		// Up to a minute: a result long poll may wait 60s.
		Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 17),
	}, []string{"route"})
}

func observeHTTP(requests *prometheus.CounterVec, duration *prometheus.HistogramVec, route string, code int, d time.Duration) {
	if route == "" {
		route = other
	}
	requests.WithLabelValues(route, statusCode(code)).Inc()
	duration.WithLabelValues(route).Observe(seconds(d))
}

// ErrNotRegistered is returned by HTTPObserver for a registerer that New
// did not register jetflow's collectors on.
var ErrNotRegistered = errors.New("metrics: jetflow's collectors are not registered on this registerer")

// HTTPObserver returns what Metrics.HTTP does, for the *Metrics that New
// registered on reg: an HTTP gateway that was handed only the registerer
// (the public jetflow.Metrics does not expose its HTTP series) records its
// requests into the same collectors. It finds them the way Prometheus
// documents, through the AlreadyRegisteredError of a second registration,
// so it keeps no state of its own. Without an earlier New on reg it fails
// with ErrNotRegistered and leaves reg as it was.
func HTTPObserver(reg prometheus.Registerer) (func(route string, code int, d time.Duration), error) {
	if reg == nil {
		return nil, ErrNilRegisterer
	}
	requests, err := existing[*prometheus.CounterVec](reg, newHTTPRequests())
	if err != nil {
		return nil, err
	}
	duration, err := existing[*prometheus.HistogramVec](reg, newHTTPDuration())
	if err != nil {
		return nil, err
	}
	return func(route string, code int, d time.Duration) {
		observeHTTP(requests, duration, route, code, d)
	}, nil
}

// existing returns the collector registered on reg that c duplicates.
func existing[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	var zero C
	err := reg.Register(c)
	if err == nil {
		reg.Unregister(c)
		return zero, ErrNotRegistered
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return zero, fmt.Errorf("metrics: find registered collector: %w", err)
	}
	have, ok := are.ExistingCollector.(C)
	if !ok {
		return zero, fmt.Errorf("%w: a collector of type %T has the name", ErrNotRegistered, are.ExistingCollector)
	}
	return have, nil
}
