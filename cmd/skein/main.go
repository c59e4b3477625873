// Command skein is the CNI plugin. It stays thin so that it starts fast:
// it reads the runtime's request (the environment and the configuration,
// checked and version-gated as the CNI library's skel would), forwards it
// to skeind in one timed gRPC call over a UNIX socket, and prints skeind's
// answer or a spec error. All the work —
// IPAM, netlink, the store — happens in skeind (see internal/cniplugin for
// the plugin, internal/cniclient for the call; imports_test.go keeps the
// binary's dependencies light).
//
// The Go runtime would fit GOMAXPROCS to a container's CPU limit and keep
// its cgroup files open to follow changes; a plugin that lives for a few
// milliseconds has no use for that (it still reads them once at start).
//
//go:debug containermaxprocs=0
package main

import "github.com/skeinnet/skein/internal/cniplugin"

var buildVersion = "dev"

func main() {
	cniplugin.Main(cniplugin.Plugin{Service: "skein.v1.CNI", About: "skein CNI plugin " + buildVersion})
}
