package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/entry"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

// scrape reads url (a /metrics endpoint) and parses it with the
// Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.LegacyValidation) // names must be classic Prometheus names
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// sample sums the values of family name over the series whose labels
// include want (counters, gauges, and histogram sample counts).
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f, ok := fams[name]
	if !ok {
		return 0
	}
	var sum float64
series:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue series
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// hasSeries reports whether family name has a series whose labels include
// want.
func hasSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string) bool {
series:
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue series
			}
		}
		return true
	}
	return false
}

// TestMetricsClientRole: a producer's metrics (NewClientMetrics) export no
// worker series, and a worker refuses them.
func TestMetricsClientRole(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	reg := prometheus.NewRegistry()
	m, err := NewClientMetrics(reg)
	require.NoError(t, err)
	ws := NewRegistry()
	require.NoError(t, ws.Register(threeSteps("refused", newCounter())))
	_, err = NewWorker(env.conn(), ws, WorkerConfig{Metrics: m})
	require.ErrorIs(t, err, ErrClientMetrics)

	c, err := NewClient(ctxT(t, 10*time.Second), env.conn(), ClientConfig{Topology: env.topo, Metrics: m})
	require.NoError(t, err)
	_, err = c.GetRun(ctxT(t, 10*time.Second), "absent")
	require.ErrorIs(t, err, ErrRunNotFound)
	fams, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range fams {
		names = append(names, f.GetName())
	}
	require.Contains(t, names, "jetflow_nats_connected")
	require.Contains(t, names, "jetflow_build_info")
	for _, worker := range []string{"jetflow_steps_in_flight", "jetflow_consumer_sample_errors_total", "jetflow_unserved_start_envelopes"} {
		require.NotContains(t, names, worker)
	}
}

// TestMetricsCountOneRun runs one workflow of three steps, started once
// and then twice more with the same run ID, and reads /metrics over HTTP:
// the counters moved by exactly one created start, two duplicates stopped
// by the run record (a duplicate publishes nothing the broker could
// stop), three committed steps and one completed run.
func TestMetricsCountOneRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	_, err = NewMetrics(reg)
	require.Error(t, err, "a second NewMetrics on one registry must fail")

	effects := newCounter()
	wf := threeSteps("metered", effects)
	w := env.worker(WorkerConfig{Metrics: m, BacklogInterval: 50 * time.Millisecond}, wf)
	c, err := NewClient(ctxT(t, 10*time.Second), env.conn(), ClientConfig{Topology: env.topo, Metrics: m})
	require.NoError(t, err)
	srv := httptest.NewServer(opshttp.Handler(reg, opshttp.Check{Name: "worker", Fn: w.Ready}))
	t.Cleanup(srv.Close)

	ctx := ctxT(t, 30*time.Second)
	var outcomes []Outcome
	for range 3 {
		h, err := Start(ctx, c, wf, 1, WithRunID("metered-1"))
		require.NoError(t, err)
		outcomes = append(outcomes, h.Outcome)
	}
	require.Equal(t, []Outcome{OutcomeCreated, OutcomeExisting, OutcomeExisting}, outcomes)
	h := &Handle[int]{RunID: "metered-1", client: c}
	out, err := h.Result(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, out)

	// The run's end is counted right after its record is written, which
	// Result may see first: wait for that one counter, then read the rest.
	url := srv.URL + "/metrics"
	require.Eventually(t, func() bool {
		return sample(scrape(t, url), "jetflow_runs_finished_total", nil) == 1
	}, 10*time.Second, 10*time.Millisecond)
	fams := scrape(t, url)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// The state as admission saw it: running, or completed when the
		// worker that received the start task finished the run before
		// the admission read the record back (a busy machine).
		{"jetflow_starts_total", map[string]string{"workflow": "metered", "entry": "sdk", "outcome": "created"}, 1},
		{"jetflow_starts_total", map[string]string{"entry": "sdk", "outcome": "existing"}, 2},
		{"jetflow_starts_total", nil, 3},
		{"jetflow_duplicates_suppressed_total", map[string]string{"layer": "kv"}, 2},
		{"jetflow_duplicates_suppressed_total", nil, 2},
		{"jetflow_steps_total", map[string]string{"workflow": "metered", "result": "committed"}, 3},
		{"jetflow_steps_total", nil, 3},
		{"jetflow_step_duration_seconds", map[string]string{"workflow": "metered", "step": "b"}, 1},
		{"jetflow_step_duration_seconds", nil, 3},
		{"jetflow_runs_finished_total", map[string]string{"workflow": "metered", "state": "completed"}, 1},
		{"jetflow_run_duration_seconds", map[string]string{"workflow": "metered", "state": "completed"}, 1},
		{"jetflow_redeliveries_total", nil, 0},
		{"jetflow_max_deliveries_total", nil, 0},
	} {
		require.Equal(t, tc.want, sample(fams, tc.name, tc.labels), "%s%v", tc.name, tc.labels)
	}
	// Series whose first increment an alert must see exist at 0 from the
	// worker's start (a counter created at 1 shows no increase()).
	for _, zero := range []struct {
		name   string
		labels map[string]string
	}{
		{"jetflow_max_deliveries_total", map[string]string{"workflow": "metered"}},
		{"jetflow_runs_stuck_total", map[string]string{"workflow": "metered"}},
		{"jetflow_runs_finished_total", map[string]string{"workflow": "metered", "state": "failed"}},
		{"jetflow_starts_total", map[string]string{"workflow": "metered", "entry": "nats", "outcome": "error", "state": "none"}},
		{"jetflow_starts_total", map[string]string{"workflow": "metered", "entry": "http", "outcome": "error", "state": "none"}},
		{"jetflow_steps_total", map[string]string{"workflow": "metered", "step": "a", "result": "failed"}},
		{"jetflow_steps_total", map[string]string{"workflow": "metered", "step": "c", "result": "fatal"}},
	} {
		require.True(t, hasSeries(fams, zero.name, zero.labels), "%s%v is not exported", zero.name, zero.labels)
		require.Zero(t, sample(fams, zero.name, zero.labels), "%s%v", zero.name, zero.labels)
	}
	require.Equal(t, 1.0, sample(fams, "jetflow_nats_connected", nil))
	require.True(t, hasSeries(fams, "jetflow_nats_reconnects_total", nil))
	require.Equal(t, 1.0, sample(fams, "jetflow_build_info", map[string]string{"role": "worker"}))

	require.Len(t, effects.snapshot(), 3, "three steps ran")
	for id, n := range effects.snapshot() {
		require.Equal(t, 1, n, "step %s ran once", id)
	}

	// Backlog gauges are sampled from the worker's consumers; in-flight
	// returns to zero once nothing runs.
	// Backlogs cover the run and branch task consumers, the durable
	// start consumer, the due-timer consumer and the due-expiry consumer.
	var consumers []string
	require.Eventually(t, func() bool {
		f := scrape(t, url)
		consumers = consumers[:0]
		for _, m := range f["jetflow_consumer_pending"].GetMetric() {
			for _, l := range m.GetLabel() {
				consumers = append(consumers, l.GetValue())
			}
		}
		return len(consumers) == 5 && sample(f, "jetflow_steps_in_flight", nil) == 0
	}, 10*time.Second, 20*time.Millisecond)
	require.ElementsMatch(t, []string{"jetflow_run_metered", "jetflow_branch_metered", "jetflow_admit_metered", "jetflow_fire", "jetflow_expire"}, consumers)

	resp, err := http.Get(srv.URL + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
}

// TestMetricsEntryPoints: starts are counted by the interface they came in
// through; a gateway's entry point (entry.With on the start's context)
// labels them, and a start refused for the caller's mistake (an input the
// workflow refuses) is counted as invalid, not as an error: the
// JetflowStartErrors alert must not page on a client's typo.
func TestMetricsEntryPoints(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	wf := threeSteps("entries", newCounter())
	env.worker(WorkerConfig{Metrics: m}, wf)
	c := env.client() // no metrics: the worker admits StartByName starts
	ctx := ctxT(t, 30*time.Second)

	for i, e := range []entry.Point{"", entry.HTTP, entry.Webhook} {
		sctx := ctx
		if e != "" {
			sctx = entry.With(ctx, e)
		}
		res, err := c.StartByName(sctx, "entries", json.RawMessage(`1`), WithRunID(fmt.Sprintf("entry-%d", i)))
		require.NoError(t, err)
		require.Equal(t, OutcomeCreated, res.Outcome)
	}
	_, err = c.StartByName(ctx, "entries", json.RawMessage(`"not an int"`), WithRunID("entry-bad"))
	require.ErrorIs(t, err, ErrInvalidInput)

	fams, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for entry, want := range map[string]float64{"nats": 1, "http": 1, "webhook": 1, "sdk": 0} {
		require.Equal(t, want, sample(byName, "jetflow_starts_total", map[string]string{"entry": entry, "outcome": "created"}), entry)
	}
	require.Equal(t, 1.0, sample(byName, "jetflow_starts_total", map[string]string{"entry": "nats", "outcome": "invalid", "state": "none"}))
	require.Zero(t, sample(byName, "jetflow_starts_total", map[string]string{"outcome": "error"}), "a refused input is no engine failure")
}

// TestMetricsTaskKeyLayer: a step served from its task key's cached result
// counts as a duplicate stopped by the task-key layer, and still as a
// committed step of its run.
func TestMetricsTaskKeyLayer(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	sends := newCounter()
	wf := NewWorkflow("keyed-mail", func(ctx *Context, to string) (int, error) {
		return Step(ctx, "send", func(context.Context) (int, error) { return sends.inc(to), nil },
			WithTaskKey("welcome-"+to, time.Hour), WithKeyScope(ScopeGlobal))
	})
	env.worker(WorkerConfig{Metrics: m}, wf)
	c := env.client()
	ctx := ctxT(t, 30*time.Second)
	for _, id := range []string{"mail-1", "mail-2"} { // two runs, one email
		h, err := Start(ctx, c, wf, "ada", WithRunID(id))
		require.NoError(t, err)
		out, err := h.Result(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, out, "the second run reuses the first send's result")
	}
	require.Equal(t, 1, sends.get("ada"))

	fams, err := reg.Gather()
	require.NoError(t, err)
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	require.Equal(t, 1.0, sample(byName, "jetflow_duplicates_suppressed_total", map[string]string{"layer": "task_key"}))
	require.Equal(t, 2.0, sample(byName, "jetflow_steps_total", map[string]string{"workflow": "keyed-mail", "step": "send", "result": "committed"}))
}

// TestMetricsFirstFailureAndRunningRuns: while the first attempt of a step
// runs, its failed and fatal series already exist at 0 and the sweeper
// counts the run as running; when that attempt fails fatally, the fatal
// series goes from 0 to 1 (an increase an alert sees) and the run stops
// being counted.
func TestMetricsFirstFailureAndRunningRuns(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	entered, release := make(chan struct{}), make(chan struct{})
	wf := NewWorkflow("doomed", func(ctx *Context, in int) (int, error) {
		return Step(ctx, "charge", func(context.Context) (int, error) {
			close(entered)
			<-release
			return 0, Fatal(errors.New("card declined"))
		})
	})
	const sweepEvery = 20 * time.Millisecond
	within := 500 * sweepEvery // many sweeper passes, on a busy machine
	env.worker(WorkerConfig{Metrics: m, SweepInterval: sweepEvery}, wf)
	srv := httptest.NewServer(opshttp.Handler(reg))
	t.Cleanup(srv.Close)
	url := srv.URL + "/metrics"

	ctx := ctxT(t, 30*time.Second)
	_, err = Start(ctx, env.client(), wf, 1, WithRunID("doomed-1"))
	require.NoError(t, err)
	<-entered

	fatal := map[string]string{"workflow": "doomed", "step": "charge", "result": "fatal"}
	fams := scrape(t, url)
	require.True(t, hasSeries(fams, "jetflow_steps_total", fatal), "the step's fatal series exists during its first attempt")
	require.Zero(t, sample(fams, "jetflow_steps_total", fatal))
	require.True(t, hasSeries(fams, "jetflow_steps_total", map[string]string{"step": "charge", "result": "failed"}))
	require.Eventually(t, func() bool {
		return sample(scrape(t, url), "jetflow_runs_running", map[string]string{"workflow": "doomed"}) == 1
	}, within, sweepEvery/2, "the sweeper counts the running run")

	close(release)
	_, err = (&Handle[int]{RunID: "doomed-1", client: env.client()}).Result(ctx)
	require.Error(t, err)
	require.Eventually(t, func() bool {
		f := scrape(t, url)
		return sample(f, "jetflow_steps_total", fatal) == 1 &&
			sample(f, "jetflow_runs_running", map[string]string{"workflow": "doomed"}) == 0
	}, within, sweepEvery/2, "the fatal attempt is counted and the run no longer running")
}
