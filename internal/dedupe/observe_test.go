package dedupe

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// A start refused for the caller's mistake counts as outcome invalid; one
// the engine could not decide (NATS gone) as error, the only outcome the
// JetflowStartErrors alert pages on.
func TestAdmitCountsInvalidStartsApartFromErrors(t *testing.T) {
	t.Parallel()
	nc := testenv.Conn(t, testenv.Server(t))
	assets, err := jetstream.Provision(ctx(t), nc, jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewFor(reg, metrics.RoleWorker)
	require.NoError(t, err)
	a := New(assets, Config{Metrics: m})

	_, err = a.Admit(ctx(t), Request{RunID: "no spaces", Workflow: "w", Input: json.RawMessage(`1`)})
	require.ErrorIs(t, err, state.ErrInvalidRunID)
	_, err = a.Admit(ctx(t), Request{RunID: "r-big", Workflow: "w", Input: json.RawMessage(`"` + strings.Repeat("x", state.MaxInputBytes) + `"`)})
	require.ErrorIs(t, err, state.ErrInputTooLarge)
	_, err = a.Admit(ctx(t), Request{RunID: "r-1", Workflow: "w", Input: json.RawMessage(`1`)})
	require.NoError(t, err)
	a.ObserveRefusal("http", "w") // a start refused before admission (startproto)

	nc.Close()
	_, err = a.Admit(ctx(t), Request{RunID: "r-2", Workflow: "w", Input: json.RawMessage(`1`)})
	require.Error(t, err)
	require.NotErrorIs(t, err, state.ErrInvalidRunID)

	require.Equal(t, map[string]float64{
		"sdk/invalid": 2, "http/invalid": 1, "sdk/created": 1, "sdk/error": 1,
	}, startCounts(t, reg))
}

// startCounts reads jetflow_starts_total's non-zero series as
// "entry/outcome" -> count.
func startCounts(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != metrics.NameStarts {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if v := s.GetCounter().GetValue(); v != 0 {
				out[labels["entry"]+"/"+labels["outcome"]] += v
			}
		}
	}
	return out
}
