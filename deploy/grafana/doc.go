// Package grafana holds the Grafana dashboards of skeind, skein-controller
// and skein-egress (the *.json files beside this one, and a kustomization
// that makes ConfigMaps of them for Grafana's dashboard sidecar). It has no
// code: its tests check that the dashboards are well formed and that every
// metric their queries name is one the daemons really export.
package grafana
