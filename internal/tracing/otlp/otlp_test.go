package otlp_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/testsupport/otlptest"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
	"github.com/jetflow/jetflow/internal/tracing"
	"github.com/jetflow/jetflow/internal/tracing/otlp"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// ackWait is the workers' AckWait in these tests.
const ackWait = 10 * time.Second

// Without an endpoint in the environment, Setup builds no exporter and
// no provider: tracing is off.
func TestNoEndpointNoExporter(t *testing.T) {
	t.Parallel()
	getenv := mapEnv{otlp.EnvServiceName: "svc"}.get
	endpoint, err := otlp.Endpoint(getenv)
	require.NoError(t, err)
	require.Empty(t, endpoint)
	tp, stop, err := otlp.Setup(context.Background(), getenv, "jetflow-test", testenv.Logger(t))
	require.NoError(t, err)
	require.Nil(t, tp)
	stop()
	require.Nil(t, tracing.New(tp), "no provider: no tracer")

	disabled := mapEnv{otlp.EnvEndpoint: "http://127.0.0.1:4318", otlp.EnvSDKDisabled: "true"}.get
	tp, stop, err = otlp.Setup(context.Background(), disabled, "jetflow-test", testenv.Logger(t))
	require.NoError(t, err)
	require.Nil(t, tp, "OTEL_SDK_DISABLED=true: no provider")
	stop()
}

// The endpoint variables: the traces endpoint as it is, else the base
// endpoint with /v1/traces; anything but an http(s) URL is an error.
func TestEndpointFromEnvironment(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  mapEnv
		want string
		err  bool
	}{
		{env: mapEnv{otlp.EnvEndpoint: "http://collector:4318"}, want: "http://collector:4318/v1/traces"},
		{env: mapEnv{otlp.EnvEndpoint: "https://collector:4318/otlp/"}, want: "https://collector:4318/otlp/v1/traces"},
		{env: mapEnv{otlp.EnvTracesEndpoint: "http://c:4318/custom", otlp.EnvEndpoint: "http://other:1"}, want: "http://c:4318/custom"},
		{env: mapEnv{otlp.EnvEndpoint: "collector:4318"}, err: true},
		{env: mapEnv{otlp.EnvTracesEndpoint: "grpc://c:4317"}, err: true},
	} {
		got, err := otlp.Endpoint(c.env.get)
		if c.err {
			require.ErrorIs(t, err, otlp.ErrInvalidEndpoint, "%v", c.env)
			_, _, err = otlp.Setup(context.Background(), c.env.get, "x", testenv.Logger(t))
			require.ErrorIs(t, err, otlp.ErrInvalidEndpoint)
			continue
		}
		require.NoError(t, err, "%v", c.env)
		require.Equal(t, c.want, got, "%v", c.env)
	}
}

type mapEnv map[string]string

func (m mapEnv) get(k string) string { return m[k] }

// The provider Setup builds from the environment really exports: a run
// traced through it reaches an OTLP/HTTP receiver as a protobuf request on
// /v1/traces, at the latest when the provider is stopped (flushed).
func TestOTLPExporterSendsSpans(t *testing.T) {
	t.Parallel()
	collector := otlptest.New(t)
	tp, stop, err := otlp.Setup(context.Background(), mapEnv{otlp.EnvEndpoint: collector.URL}.get, "jetflow-test", testenv.Logger(t))
	require.NoError(t, err)
	require.NotNil(t, tp)

	ns := testenv.Server(t)
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(jetflow.NewWorkflow("one", func(ctx *jetflow.Context, in int) (int, error) {
		return jetflow.Step(ctx, "a", func(context.Context) (int, error) { return in + 1, nil })
	})))
	w, err := jetflow.NewWorker(testenv.Conn(t, ns), ws, jetflow.WorkerConfig{
		Logger: testenv.Logger(t), AckWait: ackWait, Tracing: jetflow.WithTracerProvider(tp),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 6*ackWait)
	defer cancel()
	require.NoError(t, w.Start(ctx))
	client, err := jetflow.NewClient(ctx, testenv.Conn(t, ns), jetflow.ClientConfig{})
	require.NoError(t, err)
	res, err := client.StartByName(ctx, "one", json.RawMessage("1"), jetflow.WithRunID("otlp-1"))
	require.NoError(t, err)
	run, err := client.WaitRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)
	require.NoError(t, w.Stop(ctx)) // the run's span is emitted before its last task is acknowledged
	stop()                          // flushes: the batch is sent now
	traces := collector.Traces()
	require.NotEmpty(t, traces, "no OTLP protobuf request with a body on /v1/traces")
	require.Contains(t, string(traces[0].Body), "otlp-1", "the run's ID is in the exported spans")
}
