package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// record calls every recording method with known values.
func record(t *testing.T, m *metrics.Metrics) {
	t.Helper()
	m.Start(metrics.EntryHTTP, "order", metrics.OutcomeCreated, "running")
	m.Start(metrics.EntryHTTP, "order", metrics.OutcomeCreated, "running")
	m.Start(metrics.EntryNATS, "order", metrics.OutcomeExisting, "completed")
	m.Start("carrier-pigeon", "order", "maybe", "") // unknown entry and outcome, unknown state
	m.Serve("refund")                               // a served workflow: its alerting series at 0
	m.RunsRunning("order", 3)
	m.RunBlocked("order", "renamed")
	m.WatchConn("nc-1", func() bool { return true }, func() uint64 { return 2 })
	m.WatchConn("nc-1", func() bool { return true }, func() uint64 { return 2 }) // the same connection again
	m.WatchConn("nc-2", func() bool { return false }, func() uint64 { return 1 })

	m.Suppressed(metrics.LayerKV)
	m.Suppressed(metrics.LayerBroker)
	m.Suppressed(metrics.LayerBroker)
	m.Suppressed("firewall")
	m.Event("order", metrics.EventDuplicate)
	m.Event("order", "lost")

	m.Step("order", "charge", metrics.StepCommitted, 250*time.Millisecond)
	m.Step("order", "charge", metrics.StepRetried, 500*time.Millisecond)
	m.Step("order", "ship", "exploded", -time.Second) // unknown result, negative duration

	m.RunFinished("order", "completed", 2*time.Second)
	m.RunFinished("order", "paused", time.Second) // not a final state

	m.Redelivered("order")
	m.Redelivered("order")
	m.MaxDeliveries("order")
	m.RunStuck("order")

	m.InFlight(1)
	m.InFlight(1)
	m.InFlight(-1)

	m.HTTP("POST /v1/workflows/{name}/runs", http.StatusCreated, 100*time.Millisecond)
	m.HTTP("POST /v1/workflows/{name}/runs", http.StatusConflict, 50*time.Millisecond)
	m.HTTP("", 42, time.Millisecond)

	m.UnservedStarts(4)
	m.UnservedStarts(3) // replaces

	ctx := t.Context()
	require.NoError(t, m.SampleBacklog(ctx, backlogs(
		metrics.Backlog{Consumer: "tasks-order", Pending: 7, AckPending: 3},
		metrics.Backlog{Consumer: "tasks-gone", Pending: 1, AckPending: 1},
	)))
	errSample := errors.New("consumer info: timeout")
	require.ErrorIs(t, m.SampleBacklog(ctx, func(context.Context) ([]metrics.Backlog, error) {
		return nil, errSample
	}), errSample)
	// tasks-gone is no longer listed: its series disappear.
	require.NoError(t, m.SampleBacklog(ctx, backlogs(
		metrics.Backlog{Consumer: "tasks-order", Pending: 5, AckPending: 2},
	)))
}

func backlogs(b ...metrics.Backlog) func(context.Context) ([]metrics.Backlog, error) {
	return func(context.Context) ([]metrics.Backlog, error) { return b, nil }
}

// sample is one expected series value.
type sample struct {
	family string
	labels map[string]string
	value  float64 // counter or gauge value, or histogram sample count
	sum    float64 // histogram sample sum
}

func TestExpositionHasExactValues(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	record(t, m)

	srv := httptest.NewServer(opshttp.Handler(reg))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)

	want := []sample{
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "http", "outcome": "created", "state": "running"}, value: 2},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "nats", "outcome": "existing", "state": "completed"}, value: 1},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "other", "outcome": "other", "state": "none"}, value: 1},
		// The first start through an entry point creates its failed starts at 0.
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "http", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "nats", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "order", "entry": "other", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameSuppressed, labels: map[string]string{"layer": "kv"}, value: 1},
		{family: metrics.NameSuppressed, labels: map[string]string{"layer": "broker"}, value: 2},
		{family: metrics.NameSuppressed, labels: map[string]string{"layer": "task_key"}, value: 0},
		{family: metrics.NameSuppressed, labels: map[string]string{"layer": "event"}, value: 1},
		{family: metrics.NameEvents, labels: map[string]string{"workflow": "order", "outcome": "duplicate"}, value: 1},
		{family: metrics.NameEvents, labels: map[string]string{"workflow": "order", "outcome": "other"}, value: 1},
		{family: metrics.NameSuppressed, labels: map[string]string{"layer": "other"}, value: 1},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "charge", "result": "committed"}, value: 1},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "charge", "result": "retried"}, value: 1},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "charge", "result": "failed"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "charge", "result": "fatal"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "ship", "result": "committed"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "ship", "result": "retried"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "ship", "result": "failed"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "ship", "result": "fatal"}, value: 0},
		{family: metrics.NameSteps, labels: map[string]string{"workflow": "order", "step": "ship", "result": "other"}, value: 1},
		{family: metrics.NameRunsRunning, labels: map[string]string{"workflow": "order"}, value: 3},
		{family: metrics.NameRunsBlocked, labels: map[string]string{"workflow": "order", "divergence": "renamed"}, value: 1},
		{family: metrics.NameNATSConnected, labels: map[string]string{}, value: 0}, // nc-2 is down
		{family: metrics.NameNATSReconnects, labels: map[string]string{}, value: 3},
		// Served: every series an alert watches for a first event, at 0.
		{family: metrics.NameMaxDeliveries, labels: map[string]string{"workflow": "refund"}, value: 0},
		{family: metrics.NameRedeliveries, labels: map[string]string{"workflow": "refund"}, value: 0},
		{family: metrics.NameRunsStuck, labels: map[string]string{"workflow": "refund"}, value: 0},
		{family: metrics.NameRunsBlockedNow, labels: map[string]string{"workflow": "refund"}, value: 0},
		{family: metrics.NameRunsFinished, labels: map[string]string{"workflow": "refund", "state": "completed"}, value: 0},
		{family: metrics.NameRunsFinished, labels: map[string]string{"workflow": "refund", "state": "failed"}, value: 0},
		{family: metrics.NameRunsFinished, labels: map[string]string{"workflow": "refund", "state": "cancelled"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "refund", "entry": "sdk", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "refund", "entry": "nats", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "refund", "entry": "http", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "refund", "entry": "webhook", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStarts, labels: map[string]string{"workflow": "refund", "entry": "child", "outcome": "error", "state": "none"}, value: 0},
		{family: metrics.NameStepDuration, labels: map[string]string{"workflow": "order", "step": "charge"}, value: 2, sum: 0.75},
		{family: metrics.NameStepDuration, labels: map[string]string{"workflow": "order", "step": "ship"}, value: 1, sum: 0},
		{family: metrics.NameRunsFinished, labels: map[string]string{"workflow": "order", "state": "completed"}, value: 1},
		{family: metrics.NameRunsFinished, labels: map[string]string{"workflow": "order", "state": "other"}, value: 1},
		{family: metrics.NameRunDuration, labels: map[string]string{"workflow": "order", "state": "completed"}, value: 1, sum: 2},
		{family: metrics.NameRunDuration, labels: map[string]string{"workflow": "order", "state": "other"}, value: 1, sum: 1},
		{family: metrics.NameRedeliveries, labels: map[string]string{"workflow": "order"}, value: 2},
		{family: metrics.NameMaxDeliveries, labels: map[string]string{"workflow": "order"}, value: 1},
		{family: metrics.NameRunsStuck, labels: map[string]string{"workflow": "order"}, value: 1},
		{family: metrics.NameStepsInFlight, labels: map[string]string{}, value: 1},
		{family: metrics.NameConsumerPending, labels: map[string]string{"consumer": "tasks-order"}, value: 5},
		{family: metrics.NameConsumerAckPending, labels: map[string]string{"consumer": "tasks-order"}, value: 2},
		{family: metrics.NameBacklogSampleErrors, labels: map[string]string{}, value: 1},
		{family: metrics.NameHTTPRequests, labels: map[string]string{"route": "POST /v1/workflows/{name}/runs", "code": "201"}, value: 1},
		{family: metrics.NameHTTPRequests, labels: map[string]string{"route": "POST /v1/workflows/{name}/runs", "code": "409"}, value: 1},
		{family: metrics.NameHTTPRequests, labels: map[string]string{"route": "other", "code": "other"}, value: 1},
		{family: metrics.NameHTTPDuration, labels: map[string]string{"route": "POST /v1/workflows/{name}/runs"}, value: 2, sum: 0.15},
		{family: metrics.NameHTTPDuration, labels: map[string]string{"route": "other"}, value: 1, sum: 0.001},
		{family: metrics.NameUnservedStarts, labels: map[string]string{}, value: 3},
	}
	// One build info series, whose role is the worker's.
	bi := families[metrics.NameBuildInfo].GetMetric()
	require.Len(t, bi, 1)
	require.Equal(t, 1.0, bi[0].GetGauge().GetValue())
	biLabels := map[string]string{}
	for _, l := range bi[0].GetLabel() {
		biLabels[l.GetName()] = l.GetValue()
	}
	require.Equal(t, "worker", biLabels["role"])
	require.NotEmpty(t, biLabels["version"])
	require.Regexp(t, `^go1\.`, biLabels["goversion"])

	// Every series in the output is expected, and every expected one is there.
	total := 0
	for _, f := range families {
		total += len(f.GetMetric())
	}
	require.Equal(t, len(want)+1, total, "series in /metrics (and the build info)")
	for _, w := range want {
		f, ok := families[w.family]
		require.True(t, ok, "family %s missing", w.family)
		got := find(f, w.labels)
		require.NotNil(t, got, "%s%v missing", w.family, w.labels)
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			require.Equal(t, w.value, got.GetCounter().GetValue(), "%s%v", w.family, w.labels)
		case dto.MetricType_GAUGE:
			require.Equal(t, w.value, got.GetGauge().GetValue(), "%s%v", w.family, w.labels)
		case dto.MetricType_HISTOGRAM:
			require.Equal(t, uint64(w.value), got.GetHistogram().GetSampleCount(), "%s%v count", w.family, w.labels)
			require.InDelta(t, w.sum, got.GetHistogram().GetSampleSum(), 1e-9, "%s%v sum", w.family, w.labels)
		default:
			t.Fatalf("%s has unexpected type %s", w.family, f.GetType())
		}
	}

	// Names lists exactly the families gathered and served.
	gathered, err := reg.Gather()
	require.NoError(t, err)
	var gatheredNames, servedNames []string
	for _, f := range gathered {
		gatheredNames = append(gatheredNames, f.GetName())
	}
	for name := range families {
		servedNames = append(servedNames, name)
	}
	names := metrics.Names()
	slices.Sort(names)
	slices.Sort(gatheredNames)
	slices.Sort(servedNames)
	require.Equal(t, names, gatheredNames)
	require.Equal(t, names, servedNames)

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not on PATH: skipped `promtool check metrics`")
		return
	}
	cmd := exec.CommandContext(t.Context(), promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics: %s", out)
	t.Logf("promtool check metrics passed")
}

// find returns the series of f whose labels are exactly labels.
func find(f *dto.MetricFamily, labels map[string]string) *dto.Metric {
	for _, m := range f.GetMetric() {
		got := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) == len(labels) && equalMaps(got, labels) {
			return m
		}
	}
	return nil
}

func equalMaps(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestStepDurationBucketsSpanOneMillisecondToAMinute(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	m.Step("order", "charge", metrics.StepCommitted, time.Millisecond)
	m.RunFinished("order", "completed", time.Hour)

	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if len(f.GetMetric()) == 0 || f.GetMetric()[0].GetHistogram() == nil {
			continue
		}
		buckets := f.GetMetric()[0].GetHistogram().GetBucket()
		first, last := buckets[0].GetUpperBound(), buckets[len(buckets)-1].GetUpperBound()
		switch f.GetName() {
		case metrics.NameStepDuration:
			require.InDelta(t, 0.001, first, 1e-9)
			require.InDelta(t, 60, last, 1e-6)
			require.Equal(t, uint64(1), buckets[0].GetCumulativeCount(), "1ms falls in the first bucket")
		case metrics.NameRunDuration:
			require.InDelta(t, 0.01, first, 1e-9)
			require.InDelta(t, 3600, last, 1e-6)
			require.Equal(t, uint64(1), buckets[len(buckets)-1].GetCumulativeCount(), "1h falls in the last bucket")
		}
	}
}

func TestNewRegistersOnceAndAllOrNothing(t *testing.T) {
	t.Parallel()

	_, err := metrics.NewFor(nil, metrics.RoleWorker)
	require.ErrorIs(t, err, metrics.ErrNilRegisterer)

	reg := prometheus.NewRegistry()
	_, err = metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	_, err = metrics.NewFor(reg, metrics.RoleWorker)
	var already prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &already, "a second New on the same registry fails")

	// A registry where one of the later names is taken: New fails and
	// leaves none of its own collectors behind.
	taken := prometheus.NewRegistry()
	// (Same help and labels: a registry keeps a name's shape for life.)
	squatter := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.NameHTTPRequests,
		Help: "HTTP API requests by route pattern and status code.",
	}, []string{"route", "code"})
	require.NoError(t, taken.Register(squatter))
	_, err = metrics.NewFor(taken, metrics.RoleWorker)
	require.Error(t, err)
	require.Contains(t, err.Error(), metrics.NameHTTPRequests)
	squatter.WithLabelValues("GET /", "200").Inc()
	families, err := taken.Gather()
	require.NoError(t, err)
	require.Len(t, families, 1, "only the squatter is left registered")
	require.True(t, taken.Unregister(squatter))
	_, err = metrics.NewFor(taken, metrics.RoleWorker)
	require.NoError(t, err, "nothing of the failed New is left to conflict with")
}

func TestClientRoleExportsNoWorkerSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleClient)
	require.NoError(t, err)
	require.Equal(t, metrics.RoleClient, m.Role())
	record(t, m) // worker calls too: they must not show up

	gathered, err := reg.Gather()
	require.NoError(t, err)
	var got []string
	for _, f := range gathered {
		got = append(got, f.GetName())
		if f.GetName() == metrics.NameBuildInfo {
			require.Equal(t, "role", f.GetMetric()[0].GetLabel()[1].GetName())
			require.Equal(t, "client", f.GetMetric()[0].GetLabel()[1].GetValue())
		}
	}
	want := metrics.NamesFor(metrics.RoleClient)
	slices.Sort(want)
	require.Equal(t, want, got, "a client exports exactly its own families")
	for _, worker := range []string{metrics.NameStepsInFlight, metrics.NameBacklogSampleErrors, metrics.NameSteps, metrics.NameUnservedStarts, metrics.NameRunsRunning} {
		require.NotContains(t, got, worker)
	}
	require.Contains(t, got, metrics.NameStarts)

	_, err = metrics.NewFor(prometheus.NewRegistry(), "gateway")
	require.ErrorIs(t, err, metrics.ErrUnknownRole)
}

func TestNamesReturnsACopy(t *testing.T) {
	t.Parallel()
	names := metrics.Names()
	require.Len(t, names, 23)
	names[0] = "changed"
	require.Equal(t, metrics.NameStarts, metrics.Names()[0])
}

func TestNilMetricsIsANoOp(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	require.NotPanics(t, func() {
		m.Start(metrics.EntrySDK, "order", metrics.OutcomeCreated, "running")
		m.Serve("order")
		m.StepBegins("order", "charge")
		m.RunsRunning("order", 1)
		m.WatchConn("nc", func() bool { return true }, func() uint64 { return 0 })
		m.Suppressed(metrics.LayerTaskKey)
		m.Step("order", "charge", metrics.StepFatal, time.Second)
		m.RunFinished("order", "failed", time.Second)
		m.Redelivered("order")
		m.MaxDeliveries("order")
		m.RunStuck("order")
		m.InFlight(1)
		m.HTTP("GET /v1/runs/{id}", http.StatusOK, time.Second)
		m.UnservedStarts(1)
		called := func(context.Context) ([]metrics.Backlog, error) {
			t.Error("sample called on a nil *Metrics")
			return nil, nil
		}
		m.WatchBacklog(t.Context(), time.Millisecond, called)
		require.NoError(t, m.SampleBacklog(t.Context(), called))
	})
}

func TestWatchBacklogSamplesUntilCancelled(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)

	const interval = 5 * time.Millisecond
	type call struct {
		n          int
		deadlineOK bool
	}
	// Buffered: a call is never lost because the test was slow to read it
	// (a loaded machine), and a sampler that runs on meanwhile never blocks.
	calls := make(chan call, 1000)
	n := 0
	sample := func(ctx context.Context) ([]metrics.Backlog, error) {
		n++ // calls are sequential: no lock needed (the race detector checks)
		deadline, ok := ctx.Deadline()
		select {
		case calls <- call{n: n, deadlineOK: ok && time.Until(deadline) <= interval}:
		default:
		}
		if n == 1 {
			return nil, errors.New("not yet")
		}
		return []metrics.Backlog{{Consumer: "tasks", Pending: uint64(n), AckPending: 1}}, nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	m.WatchBacklog(ctx, interval, sample)
	for want := 1; want <= 3; want++ {
		select {
		case got := <-calls:
			require.Equal(t, want, got.n)
			require.True(t, got.deadlineOK, "each sample's context ends within the interval")
		case <-time.After(10 * time.Second):
			t.Fatalf("sample call %d did not happen", want)
		}
	}
	cancel() // TestMain's leak check fails if the sampling goroutine outlives the tests

	// A sample that failed was counted; a later one set the gauges.
	require.Eventually(t, func() bool {
		return gauge(t, reg, metrics.NameConsumerPending) >= 2
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, 1.0, gauge(t, reg, metrics.NameBacklogSampleErrors))
	require.Equal(t, 1.0, gauge(t, reg, metrics.NameConsumerAckPending))
}

// gauge returns the value of the first series of family name (counter or
// gauge), or -1 when there is none.
func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		s := f.GetMetric()[0]
		if s.GetCounter() != nil {
			return s.GetCounter().GetValue()
		}
		return s.GetGauge().GetValue()
	}
	return -1
}

// TestHTTPObserverRecordsIntoNewsCollectors: a gateway handed only the
// registerer records into the collectors New registered on it, and a
// registerer without them is refused and left unchanged.
func TestHTTPObserverRecordsIntoNewsCollectors(t *testing.T) {
	t.Parallel()
	_, err := metrics.HTTPObserver(nil)
	require.ErrorIs(t, err, metrics.ErrNilRegisterer)

	empty := prometheus.NewRegistry()
	_, err = metrics.HTTPObserver(empty)
	require.ErrorIs(t, err, metrics.ErrNotRegistered)
	_, err = metrics.NewFor(empty, metrics.RoleWorker)
	require.NoError(t, err, "the refused lookup left nothing registered")

	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	observe, err := metrics.HTTPObserver(reg)
	require.NoError(t, err)
	observe("GET /v1/runs/{id}", http.StatusOK, 100*time.Millisecond)
	m.HTTP("GET /v1/runs/{id}", http.StatusOK, 50*time.Millisecond)
	observe("", 42, time.Millisecond)

	counts := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, s := range f.GetMetric() {
			labels := ""
			for _, l := range s.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			switch f.GetName() {
			case metrics.NameHTTPRequests:
				counts[f.GetName()+"{"+labels+"}"] = s.GetCounter().GetValue()
			case metrics.NameHTTPDuration:
				counts[f.GetName()+"{"+labels+"}"] = float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	require.Equal(t, map[string]float64{
		metrics.NameHTTPRequests + "{code=200,route=GET /v1/runs/{id},}": 2,
		metrics.NameHTTPRequests + "{code=other,route=other,}":           1,
		metrics.NameHTTPDuration + "{route=GET /v1/runs/{id},}":          2,
		metrics.NameHTTPDuration + "{route=other,}":                      1,
	}, counts, "one set of collectors, shared by Metrics.HTTP and the observer")
}
