// Package deploy holds jetflow's deployment files, not code: the NATS
// configurations (nats/), the container image (docker/), Docker Compose
// (docker-compose.yml), Kubernetes manifests and Helm values (k8s/),
// Prometheus scrape configuration and alert rules (prometheus/) and the
// Grafana provisioning and dashboard (grafana/).
//
// Its test checks them without Docker or a network: every YAML and JSON
// file parses, the NATS configurations load with nats-server's own parser,
// Compose and Kubernetes reference what exists (Dockerfile, flags, probes),
// and every PromQL expression in the dashboard and the alert rules names
// only metrics that internal/metrics exports. docs/operations.md explains
// the files.
package deploy
