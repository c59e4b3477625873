// Package ctrlutil is what skein-controller's reconcilers share: the work
// queue they are built with, the count of their errors
// (skein_reconcile_errors_total) and the quiet requeue of a lost
// optimistic-concurrency race. The reconcilers themselves live in
// internal/controller (address pools, node garbage collection) and
// internal/egresscontroller (Egress gateways).
package ctrlutil
