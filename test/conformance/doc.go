// Package conformance drives skein through clients other people wrote —
// cnitool, libcni in-process, podman (CNI backend), containerd's ctr and
// the CNI reference plugins chained after skein — and checks every verb in
// every spec version skein accepts against what the CNI spec requires.
//
// A failing case names the spec's requirement and what skein did. Every
// node and pod is a throwaway network namespace (test/harness); the real
// host's network is compared before and after the runtimes that run on it
// (podman) and must not change. Run with `make conformance` (root).
package conformance
