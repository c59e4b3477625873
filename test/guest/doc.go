// Package guest runs a package's tests inside a qemu guest booted from the
// cached Debian kernel, for kernel features this host lacks (fou, ipip,
// ip6tnl; the kernel has every module). The guest is a throwaway machine:
// no disk, no network unless asked for, powered off when the tests end, so
// nothing a test does there can reach the host.
//
// # Writing a guest test
//
// A guest test is two tests in the same package. The inner one does the
// work and starts with RequireGuest, which skips it on the host:
//
//	func TestTunnelInside(t *testing.T) {
//		guest.RequireGuest(t)
//		a := harness.NewNS(t, "a") // namespaces, netlink, nftables: as on the host
//		...
//	}
//
// The outer one runs on the host and starts the inner one in the guest:
//
//	func TestTunnel(t *testing.T) {
//		guest.Run(t, guest.Config{
//			Package: "./internal/egress",
//			Run:     "^TestTunnelInside$",
//			Modules: append(append([]string{}, guest.TunnelModules...), guest.NftablesModules...),
//		})
//	}
//
// Run builds the package's tests as a static binary (CGO_ENABLED=0 go test
// -c), packs it with busybox, the modules (their dependencies resolved from
// each module's .modinfo; the cached kernel has no modules.dep) and
// Config.Files into an initramfs, boots it under qemu with TCG, and runs
// the binary as root with -test.v and the -test.run / -test.bench flags
// Config asks for. The inner output is logged through the outer test (go
// test -v shows it); the outer test fails with the inner failures, with a
// module that did not load (named), or when the guest does not finish in
// Config.Timeout (the console is shown). Run returns the Result (output,
// exit code, timings) for tests that read figures from the output, such as
// benchmarks.
//
// Run skips only when a prerequisite is absent: qemu-system-x86_64, the
// cached kernel (scripts/deps.d/vm.sh, i.e. make deps), /bin/busybox
// (busybox-static), the go command. Inside the guest Run skips (no
// nesting), so an outer test matched by the inner -test.run does no harm;
// name the inner test exactly.
//
// # The guest
//
// /init mounts proc, sysfs, devtmpfs, devpts, cgroup2, tmpfs on /run and
// /tmp, makes /run/netns and / shared (namespace pins made by test/harness
// or the CNI ns package work as on the host), sets lo up, loads the
// modules, and runs the binary in /skein with PATH=/bin (busybox applets),
// HOME=/tmp and SKEIN_IN_GUEST=1 (InGuest). Only modules listed (and their
// dependencies) are there: nothing is auto-loaded, so list what the kernel
// would request on its own (nft_masq for a masquerade rule, nft_chain_nat
// for a NAT chain, ...). The package directory's files (testdata) are not
// copied; pass what a test reads through Config.Files. A trap seen here:
// FoU is configured over generic netlink, and a netlink.Handle without a
// NETLINK_GENERIC socket (harness.NS.Handle has NETLINK_ROUTE only) sends
// FouAdd from the calling thread's namespace instead; make the handle with
// both protocols inside the namespace (see guest_test.go). Kernel messages are
// kept off the console (the tail of the kernel log is printed when the
// tests fail). SKEIN_GUEST_CONSOLE=1 on the host logs the whole console.
//
// With Config.HostPorts the guest gets a NIC on qemu's user-mode network,
// restricted so that only the listed TCP ports of the host's loopback are
// reachable, at HostAddr (also in SKEIN_GUEST_HOST inside): a kube-apiserver
// the outer test started on 127.0.0.1:P is https://10.0.2.100:P inside.
// Its certificate names 127.0.0.1, not HostAddr: set the client's TLS
// server name (rest.Config TLSClientConfig.ServerName = "127.0.0.1"). Each
// connection is relayed by a busybox nc that qemu starts; the host's
// network is not touched (TestGuestHostPorts also checks that a port not
// listed stays unreachable).
//
// A run costs about a second to build the binary and initramfs and 5–8 s
// of guest time on this 2-core machine under load (kernel boot ≈ 2.5 s of
// guest uptime; the kernel is booted as an uncompressed ELF through its PVH
// entry, extracted once into the user's cache directory, because the
// compressed image's own decompressor costs seconds under emulation).
package guest
