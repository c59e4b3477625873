// Command skein-vm is skein's chained CNI plugin for VMs. Put it after any
// main plugin (skein, bridge, …) in a conflist: it hands each call, with
// the main plugin's result in prevResult, to skeind's VM service and
// prints skeind's answer or a spec error. skeind does the work inside the
// pod's namespace: bridge, tap and a DHCP server that serves the VM
// exactly the main plugin's result (see internal/vm). It is the skein
// binary's code (internal/cnirun) with another service, so it starts as
// fast.
//
// The Go runtime would fit GOMAXPROCS to a container's CPU limit and keep
// its cgroup files open to follow changes; a plugin that lives for a few
// milliseconds has no use for that (it still reads them once at start).
//
//go:debug containermaxprocs=0
package main

import "github.com/skeinnet/skein/internal/cnirun"

var buildVersion = "dev"

func main() {
	cnirun.Main(cnirun.Plugin{Service: "skein.v1.VM", About: "skein-vm CNI plugin " + buildVersion})
}
