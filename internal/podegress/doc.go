// Package podegress is the client side of egress NAT in skeind's
// Kubernetes mode: it decides which gateways (Egresses) each pod of this
// node sends through, from the pod's egress.skein.dev/<namespace>
// annotations, the Egresses and their Services, and keeps the pod's
// network namespace converged to that through an Applier (the egress data
// plane, egress.ApplyClient).
//
// A pod gets its tunnels during its CNI ADD (Client.Added, a
// daemon.PodHook): a gateway that cannot be resolved fails the ADD, so a
// pod never starts sending directly what should have gone through NAT.
// Afterwards a watch of this node's pods, of Egresses and of their
// Services re-applies on every change that matters to a pod (coalesced,
// one pod at a time, serialised with its ADD and DEL); there a gateway
// that went missing is reported as a Warning event on the Pod and keeps
// its last tunnel (fail closed: its destinations are not sent directly)
// until it is back or the annotation drops it; the others stay applied.
// DEL removes the tunnels, best effort.
//
// Everything an ADD reads comes from informer caches: a pod without the
// annotation costs a cache lookup and no API request (unless the cache has
// not seen the pod yet, when it is read once from the API).
package podegress
