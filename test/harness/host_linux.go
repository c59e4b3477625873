package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Host is a read-only picture of the namespaces the calling process lives in
// (for a test binary or for `make test`: the real host's). The tests must
// leave all of it as they found it.
type Host struct {
	// Net is the network namespace: links, addresses, routes of every table
	// in both families, policy rules (as State describes a test namespace).
	Net State
	// NFT is the nftables ruleset (iptables-nft rules included), one line
	// each, without counters: `nft --stateless list ruleset`.
	NFT []string
	// Mounts are the mount namespace's mounts, namespace pins (nsfs) left
	// to NetNS: "mount point type=... source=... root=...".
	Mounts []string
	// NetNS are the pinned namespaces: every nsfs mount ("pin <mount point>
	// <namespace>") and every name under NetNSDir ("name <file>"), so that
	// a pin whose file is gone and a file whose pin is gone both show.
	NetNS []string
	// Paths are WatchedDirs and their entries (see readPaths).
	Paths []string
	// FirstRun is which of FirstRunPaths existed (see TidyFirstRun).
	FirstRun map[string]bool
}

// ReadHost describes the host. nft missing is not an error: NFT is then
// nil, "not recorded", and CompareHost compares the ruleset only when both
// sides have it. Everything else that cannot be read is an error.
func ReadHost() (Host, error) {
	var host Host
	var err error
	if host.Net, err = readHostNet(); err != nil {
		return host, err
	}
	host.NFT = readNFT()
	if host.Mounts, host.NetNS, err = readMounts(); err != nil {
		return host, err
	}
	entries, err := os.ReadDir(NetNSDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return host, fmt.Errorf("read %s: %w", NetNSDir, err)
	}
	for _, e := range entries {
		host.NetNS = append(host.NetNS, "name "+filepath.Join(NetNSDir, e.Name()))
	}
	host.Paths = readPaths()
	host.FirstRun = Existing(FirstRunPaths)
	for _, s := range [][]string{host.NFT, host.Mounts, host.NetNS} {
		slices.Sort(s)
	}
	return host, nil
}

// readHostNet reads the network namespace the process runs in. IPv6
// temporary addresses (privacy extensions) are left out: the kernel replaces
// them on its own schedule, whatever the tests do.
func readHostNet() (State, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return State{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	st, err := readState(h)
	if err != nil {
		return st, fmt.Errorf("host network: %w", err)
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		return st, fmt.Errorf("host network: addrs: %w", err)
	}
	for _, a := range addrs {
		if a.Flags&unix.IFA_F_TEMPORARY != 0 {
			prefix := a.IPNet.String() + " dev "
			st.Addrs = slices.DeleteFunc(st.Addrs, func(s string) bool { return strings.HasPrefix(s, prefix) })
		}
	}
	return st, nil
}

func readNFT() []string {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil // not installed (yet): not recorded
	}
	out, err := exec.Command("nft", "--stateless", "list", "ruleset").Output()
	if err != nil {
		return []string{fmt.Sprintf("(nft list ruleset: %v)", err)}
	}
	lines := []string{} // recorded, even when empty
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// readMounts describes the mount table: mount IDs, options and propagation
// are left out (they change with remounts that leave nothing behind).
// Namespace pins (nsfs) are listed apart.
func readMounts() (described, pins []string, err error) {
	all, err := netns.MountTable()
	if err != nil {
		return nil, nil, err
	}
	for _, m := range all {
		if m.FSType == "nsfs" {
			pins = append(pins, fmt.Sprintf("pin %s %s", m.Point, m.Root))
			continue
		}
		described = append(described, fmt.Sprintf("%s type=%s source=%s root=%s", m.Point, m.FSType, m.Source, m.Root))
	}
	return described, pins, nil
}

// UnmountUnder detaches (lazily) every mount below dir, deepest first, so
// that the directory can be removed: a runtime or engine that died, or was
// killed at a test's end, may leave its mounts behind. Errors are ignored:
// it is cleanup, and what stays shows in `make test`'s host check.
func UnmountUnder(dir string) {
	all, err := netns.MountTable()
	if err != nil {
		return
	}
	var below []string
	for _, m := range all {
		if strings.HasPrefix(m.Point, dir+"/") {
			below = append(below, m.Point)
		}
	}
	slices.Sort(below)
	for i := len(below) - 1; i >= 0; i-- {
		_ = unix.Unmount(below[i], unix.MNT_DETACH)
	}
}

// NetNSDirMount reports whether s (an entry of Host.Mounts) is NetNSDir
// mounted onto itself: what iproute2 and podman make on first use, and
// netns.Create before its first pin. It is never undone (unmounting it
// would hide every namespace pinned below it), so a check of the host
// before and after may see it appear.
func NetNSDirMount(s string) bool {
	point, rest, _ := strings.Cut(s, " ")
	_, root, _ := strings.Cut(rest, " root=")
	// root is the directory's path in its file system: /run/netns when /run
	// is part of /, /netns when /run is a tmpfs of its own.
	return point == NetNSDir && root != "/" && strings.HasSuffix(root, "/"+filepath.Base(NetNSDir))
}

// HostDiff is one part of the host that changed.
type HostDiff struct {
	What        string // "links", "routes", "mounts", ...
	Gone, Added []string
}

func (d HostDiff) String() string {
	return fmt.Sprintf("%s changed:\n  gone:  %s\n  added: %s", d.What,
		strings.Join(d.Gone, "\n         "), strings.Join(d.Added, "\n         "))
}

// CompareHost returns every part of the host that differs between before
// and after; network only (links, addresses, routes, rules, nftables) when
// all is false.
func CompareHost(before, after Host, all bool) []HostDiff {
	parts := []struct {
		what string
		a, b []string
	}{
		{"links", before.Net.Links, after.Net.Links},
		{"addresses", before.Net.Addrs, after.Net.Addrs},
		{"routes", before.Net.Routes, after.Net.Routes},
		{"rules", before.Net.Rules, after.Net.Rules},
	}
	if before.NFT != nil && after.NFT != nil {
		parts = append(parts, struct {
			what string
			a, b []string
		}{"nftables", before.NFT, after.NFT})
	}
	if all {
		parts = append(parts, []struct {
			what string
			a, b []string
		}{
			{"namespaces", before.NetNS, after.NetNS},
			{"mounts", before.Mounts, after.Mounts},
			{"paths", before.Paths, after.Paths},
		}...)
	}
	var out []HostDiff
	for _, p := range parts {
		if gone, added := diff(p.a, p.b); len(gone)+len(added) > 0 {
			out = append(out, HostDiff{What: p.what, Gone: gone, Added: added})
		}
	}
	return out
}

// HostNet reads the host for AssertHostSame; it calls t.Fatal if it cannot.
func HostNet(t testing.TB) Host {
	t.Helper()
	h, err := ReadHost()
	if err != nil {
		t.Fatalf("read the host's state: %v", err)
	}
	return h
}

// AssertHostSame fails the test (t.Errorf) if the host's network (links,
// addresses, routes, rules, nftables) differs from before; when says at
// which point of the test. Mounts and pinned namespaces are not compared:
// tests of other packages running at the same time make and remove their
// own (`make test` compares those once every test is done).
func AssertHostSame(t testing.TB, before Host, when string) {
	t.Helper()
	for _, d := range CompareHost(before, HostNet(t), false) {
		t.Errorf("the host's own network changed %s (it must never be touched): %s", when, d)
	}
}
