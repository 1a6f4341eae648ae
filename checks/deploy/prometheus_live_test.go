package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/jetflow/jetflow/embedded"
)

// scrapeInterval is how often the test's Prometheus scrapes and evaluates
// the alert rules; every wait on Prometheus is a multiple of it.
const scrapeInterval = time.Second

// TestMonitoringAgainstPrometheus builds cmd/worker and cmd/producer, runs
// them on an embedded NATS server, has a real Prometheus (the prometheus
// binary, Debian package prometheus) scrape them and evaluate alerts.yml
// while the producer's HTTP API starts runs (new ones, duplicates, a
// conflicting payload), then evaluates every dashboard query and every
// alert expression. It fails on a query Prometheus rejects, on a metric
// name neither binary exports, on a panel without data, on a rule whose
// evaluation fails, and on a worker-only series exported by the producer.
func TestMonitoringAgainstPrometheus(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds two commands and runs Prometheus: not in -short")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not on PATH: install Debian's prometheus package (CI does, .ci/run) to evaluate the dashboard and alerts against a real Prometheus")
	}
	dir := t.TempDir()
	bin := buildCommands(t, dir, "worker", "producer")

	nats, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(dir, "nats"), Port: -1})
	require.NoError(t, err)
	t.Cleanup(nats.Shutdown)

	workerOps, producerHTTP, promAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	startProcess(t, dir, "worker", bin["worker"], "--nats-url", nats.ClientURL(), "--ops-addr", workerOps,
		"--concurrency", "8", "--flaky-charge", "--sweep-interval", "1s", "--log-level", "warn")
	startProcess(t, dir, "producer", bin["producer"], "serve", "--nats-url", nats.ClientURL(),
		"--http-addr", producerHTTP, "--log-level", "warn")
	waitReady(t, "http://"+workerOps+"/readyz")
	waitReady(t, "http://"+producerHTTP+"/readyz")

	rules, err := filepath.Abs(filepath.Join("prometheus", "alerts.yml"))
	require.NoError(t, err)
	conf, err := yaml.Marshal(map[string]any{
		"global":     map[string]any{"scrape_interval": scrapeInterval.String(), "evaluation_interval": scrapeInterval.String()},
		"rule_files": []string{rules},
		"scrape_configs": []map[string]any{
			{"job_name": "jetflow-worker", "static_configs": []map[string]any{{"targets": []string{workerOps}}}},
			{"job_name": "jetflow-producer", "static_configs": []map[string]any{{"targets": []string{producerHTTP}}}},
		},
	})
	require.NoError(t, err)
	confPath := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(confPath, conf, 0o600))
	startProcess(t, dir, "prometheus", promBin, "--config.file="+confPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	prom := promAPI{t: t, base: "http://" + promAddr}
	waitReady(t, prom.base+"/-/ready")
	prom.waitFor(`count(up == 1) == 2`, "both targets scraped")

	created := startLoad(t, "http://"+producerHTTP)
	prom.waitFor(fmt.Sprintf(`sum(jetflow_runs_finished_total{job="jetflow-worker", state="completed"}) >= %d`, created), "every run's end scraped")
	// The producer is scraped on its own clock: wait until a scrape saw
	// every request of the load (two starts and a result per run, and the
	// conflict and the invalid start), or its metrics would look
	// unexported.
	prom.waitFor(fmt.Sprintf(`sum(jetflow_http_requests_total{job="jetflow-producer"}) >= %d`, 3*created+2), "every HTTP request scraped")
	// The client's invalid start is no engine failure: JetflowStartErrors
	// counts outcome="error" only.
	prom.waitFor(`sum(jetflow_starts_total{job="jetflow-worker", outcome="invalid"}) >= 1`, "the invalid start scraped")
	require.Empty(t, prom.query(`sum(jetflow_starts_total{outcome="error"}) > 0`), "a client's invalid start counted as an error")
	prom.waitFor(`count(jetflow_runs_running{job="jetflow-worker"}) > 0`, "the sweeper's count of running runs scraped")
	// Backlogs are sampled at the worker's start and every 15 s; a first
	// sample that failed (a consumer still being created) is repeated then.
	prom.waitFor(`count(jetflow_consumer_pending{job="jetflow-worker"}) > 0`, "a backlog sample scraped")

	// What the binaries export, by job.
	exported := map[string][]string{}
	for _, s := range prom.query(`count by (__name__, job) ({__name__=~"jetflow_.+"})`) {
		exported[s.Metric["__name__"]] = append(exported[s.Metric["__name__"]], s.Metric["job"])
	}
	for _, workerOnly := range []string{"jetflow_steps_in_flight", "jetflow_consumer_sample_errors_total", "jetflow_consumer_pending", "jetflow_steps_total"} {
		require.Equal(t, []string{"jetflow-worker"}, exported[workerOnly], "%s must come from workers only", workerOnly)
	}
	for _, both := range []string{"jetflow_build_info", "jetflow_nats_connected", "jetflow_nats_reconnects_total"} {
		require.ElementsMatch(t, []string{"jetflow-worker", "jetflow-producer"}, exported[both], both)
	}
	require.Len(t, prom.query(`jetflow_build_info{job="jetflow-producer", role="client"} == 1`), 1)
	require.Len(t, prom.query(`jetflow_nats_connected == 1`), 2, "both processes are connected")

	names := func(expr string) []string {
		var out []string
		for _, n := range promMetric.FindAllString(promString.ReplaceAllString(expr, `""`), -1) {
			if _, ok := exported[n]; !ok {
				out = append(out, n)
			}
		}
		return out
	}

	// Every dashboard query, with Grafana's variables filled in: no
	// error, no unexported metric, data. A healthy run has no 5xx answer:
	// the error ratio panel shows 0 then, not "no data".
	panels, variables := dashboardQueries(t)
	for _, expr := range panels {
		require.Empty(t, names(expr), "dashboard query %s names metrics the binaries do not export", expr)
		q := strings.NewReplacer("$workflow", ".*", "$__rate_interval", (30 * scrapeInterval).String()).Replace(expr)
		prom.query(q) // valid before it has data
		// A rate needs two scrapes of a series born during the load.
		prom.waitFor(q, "data of a dashboard query")
	}
	require.Empty(t, prom.query(`sum(jetflow_http_requests_total{code=~"5.."})`), "the load got a 5xx: the zero ratio was not tested")
	for _, v := range variables {
		m := regexp.MustCompile(`^label_values\((\w+), (\w+)\)$`).FindStringSubmatch(v)
		require.NotNil(t, m, "variable query %s", v)
		require.Empty(t, names(m[1]))
		require.Contains(t, prom.labelValues(m[2], m[1]), "order", "variable %s", v)
	}

	// Every alert expression: valid, on exported metrics, and every rule
	// evaluated by Prometheus without error (quiet or not).
	var f struct {
		Groups []struct {
			Rules []promRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, rules), &f))
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			require.Empty(t, names(r.Expr), "alert %s names metrics the binaries do not export", r.Alert)
			prom.query(r.Expr)
		}
	}
	prom.rulesHealthy()
}

// buildCommands builds ./cmd/<name> for each name into dir and returns
// the binaries' paths by name.
func buildCommands(t *testing.T, dir string, names ...string) map[string]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err)
	out := map[string]string{}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
		out[n] = filepath.Join(dir, n)
	}
	build := exec.CommandContext(t.Context(), goTool, args...)
	build.Dir = ".."
	b, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", b)
	return out
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// startProcess runs bin with args, its output in dir/<name>.log (printed
// when the test fails), and stops it with SIGTERM at cleanup.
func startProcess(t *testing.T, dir, name, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * scrapeInterval):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s output:\n%s", name, b)
		}
	})
}

// waitReady waits until url answers 200.
func waitReady(t *testing.T, url string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := http.Get(url)
		if !assert.NoError(c, err) {
			return
		}
		_ = resp.Body.Close()
		assert.Equal(c, http.StatusOK, resp.StatusCode)
	}, 60*scrapeInterval, scrapeInterval/10, "%s never became ready", url)
}

// startLoad starts runs of the example order workflow through the
// producer's HTTP API: new runs, a duplicate of each, one payload that
// conflicts with its key's, one input of the wrong type (400), and waits
// for every created run's result. It returns how many runs were created.
func startLoad(t *testing.T, base string) int {
	t.Helper()
	const runs = 24
	post := func(key string, amount int) (int, string) {
		body := fmt.Sprintf(`{"order_id":%q,"amount_cents":%d,"currency":"usd","email":"ada@example.com"}`, key, amount)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/workflows/order/runs", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode, string(b)
	}
	expect := func(code int, key string, amount int, what string) {
		t.Helper()
		got, body := post(key, amount)
		require.Equal(t, code, got, "%s (%s): %s", what, key, body)
	}
	for i := range runs {
		key := fmt.Sprintf("monitoring-%d", i)
		expect(http.StatusCreated, key, 100+i, "a new run")
		expect(http.StatusCreated, key, 100+i, "a duplicate lands on the run")
	}
	expect(http.StatusUnprocessableEntity, "monitoring-0", 1, "another payload under a used key conflicts")
	// A client's mistake: an input that does not decode into the
	// workflow's (invalid_input), counted as outcome="invalid".
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/workflows/order/runs", strings.NewReader(`{"order_id":"x","amount_cents":"ten"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "monitoring-invalid")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "an input of the wrong type: %s", b)
	for i := range runs {
		resp, err := http.Get(fmt.Sprintf("%s/v1/runs/monitoring-%d/result?wait=30s", base, i))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "run monitoring-%d: %s", i, b)
	}
	return runs
}

// dashboardQueries returns the dashboard's panel expressions and its query
// variables' queries.
func dashboardQueries(t *testing.T) (panels, variables []string) {
	t.Helper()
	var d struct {
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"` // a string, or {"query": ...}
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join("grafana", "dashboards", "jetflow.json")), &d))
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				panels = append(panels, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok && v.Type == "query" {
			s, _ := q["query"].(string)
			variables = append(variables, s)
		}
	}
	return panels, variables
}

// promAPI queries a Prometheus server's HTTP API.
type promAPI struct {
	t    *testing.T
	base string
}

// promSeries is one series of an instant vector.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// get reads a JSON API answer into data, failing on an HTTP or API error.
func (p promAPI) get(path string, params url.Values, data any) {
	p.t.Helper()
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	require.NoError(p.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	require.NoError(p.t, json.Unmarshal(b, &env), "%s: %s", path, b)
	require.Equal(p.t, "success", env.Status, "%s %v: %s", path, params, env.Error)
	require.NoError(p.t, json.NewDecoder(bytes.NewReader(env.Data)).Decode(data))
}

// query evaluates expr now; an expression Prometheus rejects fails the
// test. A scalar or string result is returned as one series.
func (p promAPI) query(expr string) []promSeries {
	p.t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	p.get("/api/v1/query", url.Values{"query": {expr}}, &data)
	if data.ResultType != "vector" {
		return []promSeries{{}}
	}
	var out []promSeries
	require.NoError(p.t, json.Unmarshal(data.Result, &out))
	return out
}

// labelValues lists the values of label on the series of metric.
func (p promAPI) labelValues(label, metric string) []string {
	p.t.Helper()
	var out []string
	p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {metric}}, &out)
	return out
}

// waitFor waits until expr returns data, for at most 60 scrapes.
func (p promAPI) waitFor(expr, what string) {
	p.t.Helper()
	deadline := time.Now().Add(60 * scrapeInterval)
	for len(p.query(expr)) == 0 {
		require.True(p.t, time.Now().Before(deadline), "waited 60 scrapes for %s (%s)", what, expr)
		time.Sleep(scrapeInterval / 4) // polling Prometheus, paced by its scrape interval
	}
}

// rulesHealthy waits until Prometheus has evaluated every alert rule and
// requires each evaluation to have succeeded.
func (p promAPI) rulesHealthy() {
	p.t.Helper()
	deadline := time.Now().Add(60 * scrapeInterval)
	for {
		var data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		p.get("/api/v1/rules", nil, &data)
		var pending []string
		n := 0
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				n++
				require.NotEqual(p.t, "err", r.Health, "rule %s: %s", r.Name, r.LastError)
				if r.Health != "ok" {
					pending = append(pending, r.Name)
				}
			}
		}
		require.Positive(p.t, n, "Prometheus loaded no rules")
		if len(pending) == 0 {
			return
		}
		require.True(p.t, time.Now().Before(deadline), "rules never evaluated: %v", slices.Compact(pending))
		time.Sleep(scrapeInterval / 4)
	}
}
