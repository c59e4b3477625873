// Package cniplugin runs in skeind what skein's CNI binaries (skein and
// skein-vm) were exec'd for: the binaries hand the CNI_ variables and
// stdin over whole (package cnirun), and Run checks them as the CNI
// library's skel would (dispatch.go: the same checks, codes and messages),
// calls the verb on one of skeind's services and returns what the binary
// prints — the result or a spec error in the configuration's cniVersion —
// and its exit status.
package cniplugin
