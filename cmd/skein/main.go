// Command skein is the CNI plugin. It stays thin so that it starts fast:
// it reads the runtime's request (skel parses the environment and checks
// versions), forwards it to skeind in one timed gRPC call over a UNIX
// socket, and prints skeind's answer or a spec error. All the work —
// IPAM, netlink, the store — happens in skeind (see internal/cniplugin for
// the plugin, internal/cniclient for the call; imports_test.go keeps the
// binary's dependencies light).
package main

import "github.com/skeinnet/skein/internal/cniplugin"

var buildVersion = "dev"

func main() {
	cniplugin.Main(cniplugin.Plugin{Service: "skein.v1.CNI", About: "skein CNI plugin " + buildVersion})
}
