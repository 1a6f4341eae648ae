package jetflow

import (
	"context"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// gaugeValue reads an unlabelled gauge from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// Durable start envelopes for a workflow no worker serves (a misspelt name)
// are reported by the workers: a warn log line naming the workflow and the
// jetflow_unserved_start_envelopes gauge. Envelopes of served workflows are
// not; once the stray envelopes are purged, the gauge returns to 0.
func TestUnservedStartEnvelopesAreReported(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	logs := &testenv.LogBuffer{}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	js, err := natsjs.New(env.conn())
	require.NoError(t, err)
	// The stray envelopes are stored before the worker starts: its first
	// sample sees all of them (one published between two samples would be
	// logged with the count of the first).
	env.client() // provisions the streams
	publishStart(t, js, "orders", "typo-1", `{"run_id":"typo-1","input":1}`)
	publishStart(t, js, "orders", "typo-2", `{"run_id":"typo-2","input":2}`)
	publishStart(t, js, "ordr", "typo-3", `{"run_id":"typo-3","input":3}`)
	env.worker(WorkerConfig{
		Logger: zerolog.New(logs).Level(zerolog.WarnLevel), Metrics: m, BacklogInterval: 50 * time.Millisecond,
	}, threeSteps("order", newCounter()))
	publishStart(t, js, "order", "ok-1", `{"run_id":"ok-1","input":1}`)
	waitRunStatus(t, js, "ok-1", "completed")

	const msg = "start envelopes wait for a workflow no worker serves"
	var lines []map[string]any
	require.Eventually(t, func() bool {
		lines = levelLines(t, logs, "warn", msg)
		return len(lines) >= 2 && gaugeValue(t, reg, "jetflow_unserved_start_envelopes") == 3
	}, 20*time.Second, 10*time.Millisecond, "no warning about the unserved envelopes: %v", lines)
	counts := map[string]float64{}
	for _, l := range lines {
		counts[l["workflow"].(string)] = l["envelopes"].(float64)
	}
	require.Equal(t, map[string]float64{"orders": 2, "ordr": 1}, counts, "only the unserved workflows, each once")

	starts, err := js.Stream(ctxT(t, 5*time.Second), "JETFLOW_STARTS")
	require.NoError(t, err)
	for _, s := range []string{"jetflow.start.orders", "jetflow.start.ordr"} {
		require.NoError(t, starts.Purge(ctxT(t, 5*time.Second), natsjs.WithPurgeSubject(s)))
	}
	require.Eventually(t, func() bool {
		return gaugeValue(t, reg, "jetflow_unserved_start_envelopes") == 0
	}, 20*time.Second, 10*time.Millisecond)
}

// JETFLOW_STARTS has a bounded age: 7 days by default, Topology.StartMaxAge
// when set. An envelope no worker admits is dropped after it.
func TestStartStreamMaxAge(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 30*time.Second)

	def := newEnv(t, Topology{})
	a, err := jetstream.Provision(ctx, def.conn(), jetstream.Topology{}, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	info, err := a.Starts.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, info.Config.MaxAge)
	require.Equal(t, jetstream.DefaultStartMaxAge, info.Config.MaxAge)

	topo := Topology{StartMaxAge: time.Second, DuplicateWindow: 500 * time.Millisecond}
	short := newEnv(t, topo)
	a, err = jetstream.Provision(ctx, short.conn(), topo, jetstream.CreateOrUpdate)
	require.NoError(t, err)
	js, err := natsjs.New(short.conn())
	require.NoError(t, err)
	publishStart(t, js, "orders", "old-1", `{"run_id":"old-1","input":1}`)
	require.Eventually(t, func() bool {
		info, err := a.Starts.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	}, 20*time.Second, 20*time.Millisecond, "the envelope never expired")

	for _, bad := range []Topology{{StartMaxAge: -time.Second}, {StartMaxAge: time.Minute}} { // under the 2m duplicate window
		_, err := jetstream.Provision(ctx, short.conn(), bad, jetstream.Ensure)
		require.ErrorContains(t, err, "StartMaxAge")
	}
}
