// Package egresscontroller is skein-controller's Egress reconciler: it
// runs each Egress (a NAT gateway for chosen pods) as a Deployment of
// router pods running skein-egress and a Service in front of them, and
// keeps the routers' ServiceAccount and the grants it needs in step —
// its namespace's Egresses by name, pods only in the namespaces those
// Egresses serve. It checks an Egress's pod template against the
// namespace's policy before running it (no host namespaces, host paths,
// extra containers, other images or accounts unless the namespace's
// administrator allows custom pods). controller.Setup registers it with
// the other reconcilers.
package egresscontroller
