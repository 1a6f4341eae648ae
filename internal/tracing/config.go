package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The standard OpenTelemetry environment variables the commands read.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvServiceName    = "OTEL_SERVICE_NAME"
)

// ErrInvalidEndpoint: an OTLP endpoint variable that is not an http or
// https URL.
var ErrInvalidEndpoint = errors.New("jetflow: invalid OTLP endpoint")

// Endpoint returns the OTLP/HTTP traces URL the environment configures:
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or
// OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces appended; "" when neither is
// set (tracing off).
func Endpoint(getenv func(string) string) (string, error) {
	raw, base := strings.TrimSpace(getenv(EnvTracesEndpoint)), false
	name := EnvTracesEndpoint
	if raw == "" {
		raw, base, name = strings.TrimSpace(getenv(EnvEndpoint)), true, EnvEndpoint
	}
	if raw == "" {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%w: %s=%q: want an http:// or https:// URL", ErrInvalidEndpoint, name, raw)
	}
	if base {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return u.String(), nil
}

// Setup builds the TracerProvider the environment configures: an OTLP/HTTP
// exporter (protobuf) to Endpoint's URL behind a batching processor, the
// service named by OTEL_SERVICE_NAME (service when unset), and IDGenerator.
// Without an endpoint it returns a nil provider (tracing off) and a
// shutdown that does nothing. shutdown flushes the spans not yet exported;
// call it before the process exits. The exporter's other settings
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, ...) are read by the exporter
// itself.
func Setup(ctx context.Context, getenv func(string) string, service string) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	noShutdown := func(context.Context) error { return nil }
	endpoint, err := Endpoint(getenv)
	if err != nil || endpoint == "" {
		return nil, noShutdown, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, noShutdown, fmt.Errorf("jetflow: OTLP trace exporter: %w", err)
	}
	if name := strings.TrimSpace(getenv(EnvServiceName)); name != "" {
		service = name
	}
	p := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithIDGenerator(IDGenerator()),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	return p, p.Shutdown, nil
}
