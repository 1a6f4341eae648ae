// Package deploy checks jetflow's deployment files, which are not code and
// live in the repository's deploy/ directory: the NATS configurations
// (nats/), the container image (docker/), Docker Compose
// (docker-compose.yml), Kubernetes manifests and Helm values (k8s/),
// Prometheus scrape configuration and alert rules (prometheus/) and the
// Grafana provisioning and dashboard (grafana/). It is in the checks
// module, so that compose-go and the Kubernetes types are in no build of a
// program that imports jetflow; its tests run in deploy/ (TestMain changes
// into it), so that every path they name is relative to deploy/ as the
// files' own references are.
//
// Its test checks them without Docker or a network: every YAML and JSON
// file parses, the NATS configurations load with nats-server's own parser,
// docker-compose.yml loads with compose-go (the loader of docker compose),
// the Kubernetes manifests decode strictly into their k8s.io/api types and
// refer to what exists (selectors, probe and Service ports, ServiceAccounts,
// ConfigMaps, Secret keys), the worker and producer binaries accept every
// command line and JETFLOW_* variable Compose and Kubernetes give them
// (--print-config), and every PromQL expression in the dashboard and the
// alert rules names only metrics that internal/metrics exports.
// docs/operations.md explains the files.
package deploy
