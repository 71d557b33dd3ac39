// Package deploy holds the tests of intentd's deployment files: the
// container image (Dockerfile), the compose file, the Kubernetes manifests
// and the Prometheus rules and Grafana dashboard. It is a module of its own
// so that their heavy parsers (buildkit, compose-go, kustomize, the
// Kubernetes and Prometheus types) never enter the product's go.mod.
package deploy
