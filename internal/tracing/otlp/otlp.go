// Package otlp builds the OpenTelemetry tracer provider the commands
// export spans with, from the standard OTEL_* environment variables: the
// OTLP/HTTP exporter and the SDK's batching. It is apart from
// internal/tracing (the spans themselves) so that only the commands that
// export build the exporter and what it imports; a program that passes its
// own provider, or none, does not.
package otlp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/tracing"

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
	// EnvSDKDisabled "true" turns tracing off whatever the endpoint.
	EnvSDKDisabled = "OTEL_SDK_DISABLED"
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

// The engine's generator is the SDK's.
var _ sdktrace.IDGenerator = tracing.IDGenerator()

// ShutdownTimeout bounds the flush of the spans not yet exported when a
// command stops.
const ShutdownTimeout = 5 * time.Second

// Setup builds the TracerProvider the environment configures: an OTLP/HTTP
// exporter (protobuf) to Endpoint's URL behind a batching processor, the
// service named by OTEL_SERVICE_NAME (service when unset), and IDGenerator.
// Without an endpoint, or with OTEL_SDK_DISABLED=true, it returns a nil
// provider (tracing off, no exporter) and a stop that does nothing. stop flushes the spans not yet exported
// (within ShutdownTimeout, a failure logged on log) and shuts the provider
// down; call it before the process exits. The exporter's other settings
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, ...) are read by the exporter
// itself.
func Setup(ctx context.Context, getenv func(string) string, service string, log zerolog.Logger) (tp trace.TracerProvider, stop func(), err error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return nil, func() {}, nil
	}
	endpoint, err := Endpoint(getenv)
	if err != nil || endpoint == "" {
		return nil, func() {}, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, func() {}, fmt.Errorf("jetflow: OTLP trace exporter: %w", err)
	}
	if name := strings.TrimSpace(getenv(EnvServiceName)); name != "" {
		service = name
	}
	p := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithIDGenerator(tracing.IDGenerator()),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	log.Info().Str("endpoint", endpoint).Str("service", service).Msg("tracing: exporting spans over OTLP/HTTP")
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("tracing: cannot flush the last spans")
		}
	}, nil
}
