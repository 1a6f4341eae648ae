package deploy

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/jetflow/jetflow/internal/metrics"
)

// ---------------------------------------------------------------------------
// Prometheus and Grafana: every metric named exists.

// histograms are the families exported as histograms: PromQL reads them
// through their _bucket, _sum and _count series.
var histograms = map[string]bool{
	"jetflow_step_duration_seconds":         true,
	"jetflow_run_duration_seconds":          true,
	"jetflow_http_request_duration_seconds": true,
}

// metricLabels are the label names of each family, as internal/metrics
// registers them.
var metricLabels = map[string][]string{
	"jetflow_starts_total":                  {"workflow", "entry", "outcome", "state"},
	"jetflow_duplicates_suppressed_total":   {"layer"},
	"jetflow_steps_total":                   {"workflow", "step", "result"},
	"jetflow_step_duration_seconds":         {"workflow", "step"},
	"jetflow_runs_finished_total":           {"workflow", "state"},
	"jetflow_run_duration_seconds":          {"workflow", "state"},
	"jetflow_redeliveries_total":            {"workflow"},
	"jetflow_max_deliveries_total":          {"workflow"},
	"jetflow_steps_in_flight":               {},
	"jetflow_consumer_pending":              {"consumer"},
	"jetflow_consumer_ack_pending":          {"consumer"},
	"jetflow_consumer_sample_errors_total":  {},
	"jetflow_http_requests_total":           {"route", "code"},
	"jetflow_http_request_duration_seconds": {"route"},
	"jetflow_runs_stuck_total":              {"workflow"},
	"jetflow_unserved_start_envelopes":      {},
	"jetflow_runs_running":                  {"workflow"},
	"jetflow_runs_blocked_total":            {"workflow", "divergence"},
	"jetflow_runs_blocked":                  {"workflow"},
	"jetflow_events_total":                  {"workflow", "outcome"},
	"jetflow_build_info":                    {"version", "goversion", "role"},
	"jetflow_nats_connected":                {},
	"jetflow_nats_reconnects_total":         {},
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance"}

func TestMetricTablesMatchTheMetricsPackage(t *testing.T) {
	t.Parallel()
	names := metrics.Names()
	for name := range metricLabels {
		require.Contains(t, names, name, "metricLabels names a family internal/metrics does not export")
	}
	for _, name := range names {
		require.Contains(t, metricLabels, name, "metricLabels lacks the labels of %s", name)
	}
	for name := range histograms {
		require.Contains(t, names, name)
	}
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'` + "|`[^`]*`")
	promMetric   = regexp.MustCompile(`\bjetflow_[a-zA-Z0-9_]*`)
	promUp       = regexp.MustCompile(`\bup\b`)
	promSelector = regexp.MustCompile(`\b(jetflow_[a-zA-Z0-9_]*|up)\s*\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promJob      = regexp.MustCompile(`\bjob\s*=\s*"([^"]*)"`)
)

// checkPromQL reports what is wrong with expr: a metric name that
// internal/metrics does not export (a histogram counts through _bucket,
// _sum and _count only), a label a family does not have, a quantile
// without le, or no jetflow metric at all.
func checkPromQL(expr string) []error {
	exported := map[string]bool{}
	for _, n := range metrics.Names() {
		exported[n] = true
	}
	var errs []error
	bare := promString.ReplaceAllString(expr, `""`)

	families := map[string]bool{}
	for _, name := range promMetric.FindAllString(bare, -1) {
		family, ok := metricFamily(name, exported)
		if !ok {
			errs = append(errs, errors.New("unknown metric "+name))
			continue
		}
		families[family] = true
	}
	if len(families) == 0 && !promUp.MatchString(bare) {
		errs = append(errs, errors.New("names no jetflow metric"))
	}

	allowed := slices.Clone(targetLabels)
	for f := range families {
		allowed = append(allowed, metricLabels[f]...)
		if histograms[f] {
			allowed = append(allowed, "le")
		}
	}
	for _, m := range promSelector.FindAllStringSubmatch(bare, -1) {
		family, ok := metricFamily(m[1], exported)
		if !ok || m[1] == "up" {
			continue
		}
		labels, known := metricLabels[family]
		if !known {
			continue
		}
		own := append(slices.Clone(targetLabels), labels...)
		if strings.HasSuffix(m[1], "_bucket") {
			own = append(own, "le")
		}
		for _, lm := range promMatcher.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(own, lm[1]) {
				errs = append(errs, errors.New(m[1]+" has no label "+lm[1]))
			}
		}
	}
	groupsLE := false
	for _, g := range promGrouping.FindAllStringSubmatch(bare, -1) {
		for _, l := range strings.Split(g[1], ",") {
			l = strings.TrimSpace(l)
			if l == "" {
				continue
			}
			groupsLE = groupsLE || l == "le"
			if !slices.Contains(allowed, l) {
				errs = append(errs, errors.New("groups by "+l+", a label none of its metrics has"))
			}
		}
	}
	if strings.Contains(bare, "histogram_quantile") && !groupsLE {
		errs = append(errs, errors.New("histogram_quantile without le in its grouping"))
	}
	return errs
}

// metricFamily maps a series name to its exported family.
func metricFamily(name string, exported map[string]bool) (string, bool) {
	if name == "up" {
		return "", true
	}
	if exported[name] {
		return name, !histograms[name]
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] && histograms[base] {
			return base, true
		}
	}
	return "", false
}

func TestCheckPromQLCatchesMistakes(t *testing.T) {
	t.Parallel()
	for expr, ok := range map[string]bool{
		`sum by (outcome) (rate(jetflow_starts_total[5m]))`:                                        true,
		`histogram_quantile(0.99, sum by (le) (rate(jetflow_step_duration_seconds_bucket[5m])))`:   true,
		`max by (consumer) (jetflow_consumer_pending{consumer=~"jetflow_(run|branch)_.*"})`:        true,
		`absent(up{job="jetflow-worker"} == 1)`:                                                    true,
		`sum(rate(jetflow_start_total[5m]))`:                                                       false, // typo
		`rate(jetflow_step_duration_seconds[5m])`:                                                  false, // histogram without suffix
		`histogram_quantile(0.99, sum by (step) (rate(jetflow_step_duration_seconds_bucket[5m])))`: false, // no le
		`sum(rate(jetflow_steps_total{results="failed"}[5m]))`:                                     false, // label typo
		`sum by (layer) (rate(jetflow_steps_total[5m]))`:                                           false, // label of another family
		`vector(1)`: false,
		`sum(rate(jetflow_http_requests_total{code=~"5.."}[5m])) / sum(rate(jetflow_http_requests_total[5m]))`: true,
	} {
		errs := checkPromQL(expr)
		require.Equal(t, ok, len(errs) == 0, "%s: %v", expr, errs)
	}
}

type grafanaPanel struct {
	ID      int            `json:"id"`
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	GridPos map[string]int `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	var d struct {
		UID        string         `json:"uid"`
		Title      string         `json:"title"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(readFile(t, filepath.Join("grafana", "dashboards", "jetflow.json")), &d))
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Title)
	require.NotEmpty(t, d.Panels)

	var exprs []string
	ids := map[int]bool{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			require.NotEmpty(t, p.Title, "panel %d has no title", p.ID)
			require.False(t, ids[p.ID], "panel id %d used twice", p.ID)
			ids[p.ID] = true
			require.Contains(t, p.GridPos, "w", "panel %q has no gridPos", p.Title)
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			require.NotEmpty(t, p.Targets, "panel %q has no targets", p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "panel %q has a target without expr", p.Title)
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	panelExprs := len(exprs)
	// A share (a panel that divides) shows 0, not "no data", when its
	// numerator has nothing to count, such as no 5xx answer at all: a
	// sum over no series is empty, so the numerator falls back to 0.
	for _, e := range exprs {
		if strings.Contains(promString.ReplaceAllString(e, `""`), " / ") {
			require.Regexp(t, `^\(.*\bor vector\(0\)\) / `, e, "ratio panel: its numerator needs `or vector(0)`")
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		switch q := v.Query.(type) {
		case string:
			exprs = append(exprs, q)
		case map[string]any:
			s, _ := q["query"].(string)
			exprs = append(exprs, s)
		}
	}

	used := map[string]bool{}
	exported := map[string]bool{}
	for _, n := range metrics.Names() {
		exported[n] = true
	}
	for i, e := range exprs {
		require.Empty(t, checkPromQL(e), "dashboard expr %s", e)
		for _, n := range promMetric.FindAllString(promString.ReplaceAllString(e, `""`), -1) {
			used[n] = true
			// A panel over a family with a workflow label follows the
			// workflow selector (the variable's own query excepted).
			family, _ := metricFamily(n, exported)
			if i < panelExprs && slices.Contains(metricLabels[family], "workflow") {
				require.Contains(t, e, `workflow=~"$workflow"`, "panel expr %s ignores the workflow selector", e)
			}
		}
	}
	// The panels the dashboard promises (docs/operations.md).
	for _, want := range []string{
		"jetflow_starts_total", "jetflow_duplicates_suppressed_total", "jetflow_steps_total",
		"jetflow_step_duration_seconds_bucket", "jetflow_consumer_pending", "jetflow_consumer_ack_pending",
		"jetflow_steps_in_flight", "jetflow_runs_finished_total", "jetflow_run_duration_seconds_bucket",
		"jetflow_redeliveries_total", "jetflow_max_deliveries_total",
		"jetflow_http_requests_total", "jetflow_http_request_duration_seconds_bucket",
		"jetflow_runs_running", "jetflow_runs_blocked", "jetflow_nats_connected", "jetflow_nats_reconnects_total", "jetflow_build_info",
	} {
		require.True(t, used[want], "no panel shows %s", want)
	}
	requireKnownJobs(t, exprs)
}

type promRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	var f struct {
		Groups []struct {
			Name  string     `yaml:"name"`
			Rules []promRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("prometheus", "alerts.yml")), &f))
	require.NotEmpty(t, f.Groups)

	names := map[string]bool{}
	var exprs []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: a rule without alert (recording rules belong elsewhere)", g.Name)
			require.False(t, names[r.Alert], "alert %s defined twice", r.Alert)
			names[r.Alert] = true
			require.Empty(t, checkPromQL(r.Expr), "alert %s", r.Alert)
			require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], "alert %s: severity", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "alert %s: summary", r.Alert)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				require.NoError(t, err, "alert %s: for", r.Alert)
			}
			exprs = append(exprs, r.Expr)
		}
	}
	for _, want := range []string{
		"JetflowBacklogGrowing", "JetflowStepsFailing", "JetflowMaxDeliveriesHit",
		"JetflowNoWorkerUp", "JetflowIdempotencyConflictsSpike", "JetflowHTTP5xx",
		"JetflowUnservedStarts", "JetflowRunsBlocked",
	} {
		require.True(t, names[want], "alert %s missing", want)
	}
	requireKnownJobs(t, exprs)
}

type promConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func loadPromConfig(t *testing.T) promConfig {
	t.Helper()
	var c promConfig
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("prometheus", "prometheus.yml")), &c))
	return c
}

// requireKnownJobs checks that every job="..." in exprs is a scrape job.
func requireKnownJobs(t *testing.T, exprs []string) {
	t.Helper()
	jobs := map[string]bool{}
	for _, sc := range loadPromConfig(t).ScrapeConfigs {
		jobs[sc.JobName] = true
	}
	for _, e := range exprs {
		for _, m := range promJob.FindAllStringSubmatch(e, -1) {
			require.True(t, jobs[m[1]], "%s: job %q is not scraped by prometheus.yml", e, m[1])
		}
	}
}

func TestPrometheusConfig(t *testing.T) {
	t.Parallel()
	c := loadPromConfig(t)
	require.NotEmpty(t, c.RuleFiles)
	for _, f := range c.RuleFiles {
		require.FileExists(t, filepath.Join("prometheus", f))
	}

	// Static targets are compose services, on the port each one serves
	// /metrics on.
	services := loadCompose(t).Services
	jobs := map[string]bool{}
	for _, sc := range c.ScrapeConfigs {
		jobs[sc.JobName] = true
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, ok := strings.Cut(target, ":")
				require.True(t, ok, "target %s has no port", target)
				if host == "localhost" {
					continue
				}
				s, ok := services[host]
				require.True(t, ok, "job %s: target %s is not a compose service", sc.JobName, target)
				flags := parseFlags(s.Command)
				require.True(t, strings.HasSuffix(flags["ops-addr"], ":"+port) || strings.HasSuffix(flags["http-addr"], ":"+port),
					"job %s: %s does not serve on port %s", sc.JobName, host, port)
			}
		}
	}
	require.True(t, jobs["jetflow-worker"])
	require.True(t, jobs["jetflow-producer"])
}

// TestPromtool runs Prometheus's own checks when promtool is installed
// (Debian package prometheus; CI installs it), and the alert rules' unit
// tests in prometheus/alerts_test.yml; machines without promtool skip.
func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH: install Debian's prometheus package to run Prometheus's own checks of deploy/prometheus")
	}
	run := func(t *testing.T, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = ".." // the repository's root, where docs/operations.md runs it
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
	t.Run("check config", func(t *testing.T) {
		t.Parallel()
		run(t, "check", "config", filepath.Join("deploy", "prometheus", "prometheus.yml"))
	})
	t.Run("check rules", func(t *testing.T) {
		t.Parallel()
		run(t, "check", "rules", filepath.Join("deploy", "prometheus", "alerts.yml"))
	})
	t.Run("alerts fire", func(t *testing.T) {
		t.Parallel()
		run(t, "test", "rules", "deploy/prometheus/alerts_test.yml") // as docs/operations.md shows it
	})
}

// alertTests is deploy/prometheus/alerts_test.yml as far as coverage is
// concerned: which alert each case evaluates and whether it must fire.
type alertTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			AlertName string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertTestsCoverEveryAlert: alerts_test.yml (run by promtool in
// TestPromtool) has, for every alert of alerts.yml, a case where it must
// fire and one where it must stay quiet, and names no alert that does not
// exist.
func TestAlertTestsCoverEveryAlert(t *testing.T) {
	t.Parallel()
	var f struct {
		Groups []struct {
			Rules []promRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("prometheus", "alerts.yml")), &f))
	var tests alertTests
	require.NoError(t, yaml.Unmarshal(readFile(t, filepath.Join("prometheus", "alerts_test.yml")), &tests))
	require.Equal(t, []string{"alerts.yml"}, tests.RuleFiles)

	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range tests.Tests {
		for _, at := range tc.AlertRuleTest {
			if len(at.ExpAlerts) > 0 {
				fires[at.AlertName]++
			} else {
				quiet[at.AlertName]++
			}
		}
	}
	alerts := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			require.Positive(t, fires[r.Alert], "alerts_test.yml has no case where %s must fire", r.Alert)
			require.Positive(t, quiet[r.Alert], "alerts_test.yml has no case where %s must stay quiet", r.Alert)
		}
	}
	for name := range fires {
		require.True(t, alerts[name], "alerts_test.yml tests %s, which alerts.yml does not define", name)
	}
	for name := range quiet {
		require.True(t, alerts[name], "alerts_test.yml tests %s, which alerts.yml does not define", name)
	}
}
