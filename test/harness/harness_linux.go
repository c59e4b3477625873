// Package harness builds throwaway hosts for skein's privileged tests: network
// namespaces that stand in for nodes and pods, a way to run code and commands
// inside them, an in-process ping, and kernel-state snapshots for "nothing
// left behind" assertions.
//
// Every namespace is removed in t.Cleanup, also when the test fails. Nothing
// here touches the namespace the test binary runs in.
package harness

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
)

// NetNSDir is where NewNS pins namespaces, as `ip netns add` does, so that
// `ip netns exec <name>` works when debugging a stuck test. netns.Create
// prepares it as iproute2 does (a shared mount of itself) before the first
// pin, so that podman or ip(8) running later in a test do not hide the
// namespaces already pinned there.
const NetNSDir = "/run/netns"

// NamePrefix starts the name of every namespace NewNS makes, so that
// scripts/fresh-check.sh can tell a test's leftovers from anything else.
const NamePrefix = "skein-"

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces (run the tests as root)")
	}
}

// NS is a pinned network namespace owned by one test.
type NS struct {
	name, path string
}

// NewNS creates a namespace named skein-<prefix>-<random>, brings lo up in
// it and registers its removal with t.Cleanup. It calls t.Fatal on failure.
func NewNS(t testing.TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	ns := &NS{name: NamePrefix + prefix + "-" + RandHex(4)}
	ns.path = filepath.Join(NetNSDir, ns.name)
	if err := netns.Create(ns.path); err != nil {
		t.Fatalf("create netns %s: %v", ns.name, err)
	}
	t.Cleanup(func() {
		if err := netns.Remove(ns.path); err != nil {
			t.Errorf("remove netns %s: %v", ns.name, err)
		}
	})
	h, closeH, err := netns.Handle(ns.path)
	if err != nil {
		t.Fatalf("handle in %s: %v", ns.name, err)
	}
	defer closeH()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo up in %s: %v", ns.name, err)
	}
	return ns
}

// RandHex returns n random bytes in hex: names unique to one run.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Name is the namespace's name (its file name under NetNSDir).
func (ns *NS) Name() string { return ns.name }

// Path is the pinned namespace file, usable as CNI_NETNS.
func (ns *NS) Path() string { return ns.path }

// Do runs fn inside the namespace on a locked thread (see internal/netns).
func (ns *NS) Do(fn func() error) error { return netns.Do(ns.path, fn) }

// Handle returns a netlink handle in the namespace, closed at test cleanup.
func (ns *NS) Handle(t testing.TB) *netlink.Handle {
	t.Helper()
	h, closeH, err := netns.Handle(ns.path)
	if err != nil {
		t.Fatalf("handle in %s: %v", ns.name, err)
	}
	t.Cleanup(closeH)
	return h
}

// Exec runs a command inside the namespace and returns its combined output.
// The child inherits the namespace from the locked thread that forks it.
func (ns *NS) Exec(t testing.TB, name string, args ...string) (string, error) {
	t.Helper()
	var out []byte
	err := ns.Do(func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("%s %v in %s: %w", name, args, ns.name, err)
	}
	return string(out), nil
}
