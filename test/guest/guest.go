package guest

import (
	"os"
	"testing"
	"time"
)

// EnvInGuest is set to "1" in the test binary's environment inside the
// guest.
const EnvInGuest = "SKEIN_IN_GUEST"

// EnvHost names, inside a guest started with HostPorts, the address at
// which the host's loopback ports are reachable (HostAddr).
const EnvHost = "SKEIN_GUEST_HOST"

// EnvConsole, set to "1" on the host, makes Run log the whole console
// (kernel boot included), not only the test binary's output.
const EnvConsole = "SKEIN_GUEST_CONSOLE"

// HostAddr is the guest-side address standing for the host's loopback
// when Config.HostPorts is set: a TCP connection to HostAddr:P inside the
// guest reaches 127.0.0.1:P on the host, for the ports listed only.
const HostAddr = "10.0.2.100"

// Defaults for the zero values of Config.
const (
	DefaultMemoryMB = 1024
	DefaultCPUs     = 2
	DefaultTimeout  = 5 * time.Minute
)

// Module sets the guest tests commonly need; Config.Modules takes names,
// so combine them with append. Dependencies are added by Run.
var (
	// TunnelModules: FoU and the IPIP / IPv6 tunnels it carries.
	TunnelModules = []string{"fou", "fou6", "ipip", "ip6_tunnel"}
	// NftablesModules: nftables with NAT (masquerade, DNAT), conntrack
	// matches and numgen (kube-proxy style load balancing).
	NftablesModules = []string{"nf_conntrack", "nf_tables", "nft_chain_nat", "nft_nat", "nft_masq", "nft_ct", "nft_numgen"}
	// VethModules: veth pairs between namespaces.
	VethModules = []string{"veth"}
)

// Config says what to run in the guest and on what machine. Zero values
// are documented per field.
type Config struct {
	// Package is the Go package whose tests run inside, as `go test`
	// takes it, relative to the module root ("./internal/egress"). It
	// is built as a static test binary (CGO_ENABLED=0 go test -c).
	Package string
	// Tags are extra build tags for the test binary ("" = none).
	Tags string
	// Run is the -test.run regexp; "" runs every test (as go test does).
	Run string
	// Bench is the -test.bench regexp; "" runs no benchmark. As with go
	// test, tests matching Run run too: set Run to "^$" for benchmarks
	// only.
	Bench string
	// BenchTime is -test.benchtime ("" = the testing default).
	BenchTime string
	// Args are extra arguments for the test binary, after the -test.*
	// flags Run adds (-test.v, -test.run, ...); "-args" style flags of
	// the package's own go here too.
	Args []string
	// Modules are kernel modules to load, in order, each after its
	// dependencies (resolved by Run, loaded once). Names as modprobe
	// takes them; built-in ones are skipped. See TunnelModules etc.
	Modules []string
	// Files maps a guest path to a host file copied there (mode kept):
	// extra binaries such as a static skeind.
	Files map[string]string
	// Env is extra environment ("K=V") for the test binary; the harness
	// sets PATH, HOME and SKEIN_IN_GUEST=1 (and SKEIN_GUEST_HOST with
	// HostPorts) itself.
	Env []string
	// MemoryMB is the guest's memory; 0 means DefaultMemoryMB.
	MemoryMB int
	// CPUs is the guest's CPU count (TCG runs one host thread per CPU);
	// 0 means DefaultCPUs.
	CPUs int
	// Timeout bounds the whole guest run, boot to power-off; 0 means
	// DefaultTimeout. The test binary gets -test.timeout a little
	// shorter, so that a hung inner test panics with its stacks shown
	// before qemu is killed.
	Timeout time.Duration
	// HostPorts are TCP ports on the host's loopback that the guest may
	// reach at HostAddr:port (qemu user networking, restricted: nothing
	// else of the host's network is reachable). None: the guest has no
	// network device at all.
	HostPorts []int
}

// Result is how a guest run went.
type Result struct {
	// Output is the test binary's output (stdout and stderr as they
	// reached the console), carriage returns removed.
	Output string
	// Console is everything the guest printed, boot and markers included.
	Console string
	// Passed: the test binary ran and exited 0.
	Passed bool
	// ExitCode is the test binary's exit status; -1 if it did not finish.
	ExitCode int
	// Boot is the time from starting qemu to the test binary's start.
	Boot time.Duration
	// GuestBoot is the guest's own uptime when the test binary started
	// (kernel boot, /init, module loading), as the guest clock saw it.
	GuestBoot time.Duration
	// Elapsed is the time from starting qemu until it exited.
	Elapsed time.Duration
	// Build is the time spent building the test binary and initramfs.
	Build time.Duration
}

// InGuest reports whether this process runs inside a guest started by
// Run.
func InGuest() bool { return os.Getenv(EnvInGuest) == "1" }

// RequireGuest skips the test unless it runs inside the qemu guest: the
// pattern for tests needing kernel features this host lacks. Call it
// first in the inner test; an outer test on the host runs the inner one
// through Run.
func RequireGuest(t testing.TB) {
	t.Helper()
	if !InGuest() {
		t.Skip("skipping: this kernel lacks fou/ipip/ip6tnl; runs only inside the qemu guest (test/guest), through the test that calls guest.Run for it")
	}
}
