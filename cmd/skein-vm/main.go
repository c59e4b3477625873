// Command skein-vm is skein's chained CNI plugin for VMs. Put it after any
// main plugin (skein, bridge, …) in a conflist: it forwards each call, with
// the main plugin's result in prevResult, to skeind's VM service in one
// timed gRPC call and prints skeind's answer or a spec error. skeind does
// the work inside the pod's namespace: bridge, tap and a DHCP server that
// serves the VM exactly the main plugin's result (see internal/vm). Like
// the skein binary it makes its call with internal/cniclient, not grpc-go,
// so it starts fast; imports_test.go keeps it so.
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
	cniplugin.Main(cniplugin.Plugin{
		Service:       "skein.v1.VM",
		About:         "skein-vm CNI plugin " + buildVersion,
		Unimplemented: "skeind does not serve VMs (started with --vm-socket=off?)",
	})
}
