// Command skein-cni is the CNI plugin in full: it hands the runtime's
// request (the CNI_ variables and the configuration) to skeind in one frame
// over a UNIX socket and prints what skeind answers, the result or a spec
// error, with the exit status skeind gives. skeind checks the request as
// the CNI library's skel would and does all the work — IPAM, netlink, the
// store (see internal/cnirun for the binary, internal/cniplugin for
// skeind's side; cnirun's imports test keeps the binary to the packages
// any Go program starts with).
//
// Runtimes exec skein (cmd/skein), this binary's fast path in C, which
// execs skein-cni, installed next to it, for everything but handing a
// well-formed call over: VERSION, the "about" lines, the configurations it
// does not read itself, and the wording of every error (cnirun.FailedFlag).
// "type": "skein-cni" works too, and is the same plugin, slower to start.
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
