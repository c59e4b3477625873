// Command skein is the CNI plugin. It stays thin so that it starts fast:
// it hands the runtime's request (the CNI_ variables and the configuration)
// to skeind in one frame over a UNIX socket and prints what skeind answers,
// the result or a spec error, with the exit status skeind gives. skeind
// checks the request as the CNI library's skel would and does all the work
// — IPAM, netlink, the store (see internal/cnirun for the binary,
// internal/cniplugin for skeind's side; cnirun's imports test keeps the
// binary to the packages any Go program starts with).
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
	cnirun.Main(cnirun.Plugin{Service: "skein.v1.CNI", About: "skein CNI plugin " + buildVersion})
}
