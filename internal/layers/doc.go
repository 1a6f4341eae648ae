// Package layers holds no code: its test keeps the module's layers apart,
// reading the import graph with go list.
//
// The layers, from the bottom:
//
//   - The engine: the packages directly under internal/ (state,
//     jetstream, runs, runindex, dedupe, workflow, consume, sweep, ...).
//     They import each other and nothing above them: not the root
//     package, not a server package, not a command, not test support.
//     The one public package they import is jetflowtype.
//   - The public API: the root package (github.com/jetflow/jetflow),
//     embedded and jetflowtype, over the engine. jetflowtype, the types the
//     API and the engine share (the root re-exports them with aliases), is
//     a leaf: it builds the standard library only, so the engine may import
//     it without importing anything above itself. The root's build holds neither
//     nats-server (internal/natsserver, for embedded, the commands and
//     tests) nor gRPC nor the OpenTelemetry SDK and its exporter
//     (internal/tracing/otlp, for the commands).
//   - The product: internal/server/... (the HTTP API, the inspector,
//     webhooks, the timeline, the ops HTTP server, configuration, process
//     lifecycle, connections from configuration), over the public API;
//     then workermain and cmd/..., thin mains.
//   - Test support: internal/testsupport/... (embedded servers for tests,
//     fault checks, the operations cluster, doc tests, an OTLP receiver, a
//     webhook sender, the inspector as producer serve mounts it), and the
//     public test kit jetflowtest. Code outside
//     them and bench imports test support only from its tests.
//   - examples/: imported by examples, by cmd/worker (it serves the order
//     example) and by internal/testsupport/opcluster (which runs it on a
//     cluster), nothing else.
//   - checks/: a module of its own (github.com/jetflow/jetflow/checks), the
//     tests whose libraries (compose-go, the Kubernetes API types,
//     kin-openapi, jsonschema, stripe-go, chromedp) this module must not
//     require, so that they are in the module graph of no team importing
//     jetflow. Its packages import anything of this module, test support
//     included; go list of this module lists none of them, and nothing
//     here can import them. go.mod naming none of those libraries is
//     tested here.
//
// Its tests also hold go.mod's go directive at the floor, the lowest Go the
// module's dependencies allow (go 1.26.0; the toolchain line names the
// release the project develops with), and check that a team's module
// declaring that floor keeps it through go mod tidy and builds jetflow with
// that Go release's own toolchain.
package layers
