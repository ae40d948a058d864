// Package deploy holds no code: it is the folder of the container image (Dockerfile) and the
// Kubernetes manifests (k8s/) of the per-node daemon, and its tests check them: the manifests
// decoded strictly into the Kubernetes API types and validated against the API's rules and the
// daemon's own settings, the Dockerfile parsed by BuildKit's parser and linted by its rules.
// README.md is the map.
package deploy
