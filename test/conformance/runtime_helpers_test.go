package conformance

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// busyboxApplets returns the applet names of the static busybox the test
// images are made of.
func busyboxApplets(t *testing.T) (string, []string) {
	t.Helper()
	bb := "/bin/busybox"
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Skipf("skipping: %s (Debian busybox-static) is not usable: %v", bb, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	return bb, applets
}

// busyboxRootfs writes a root filesystem with busybox and its applets as
// symlinks in /bin, for runtimes that take a directory (ctr --rootfs).
func busyboxRootfs(t *testing.T, dir string) {
	t.Helper()
	bb, applets := busyboxApplets(t)
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
}

// busyboxTar is the same root filesystem as a tar stream, for image import.
func busyboxTar(t *testing.T) []byte {
	t.Helper()
	bb, applets := busyboxApplets(t)
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "proc/", "sys/", "dev/", "etc/", "tmp/"} {
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755})
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(data))})
	_, _ = tw.Write(data)
	for _, a := range applets {
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unmountUnder detaches every mount below dir (a runtime that died may
// leave some), so that the directory can be removed.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	slices.Sort(mounts)
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = unix.Unmount(mounts[i], unix.MNT_DETACH)
	}
}

// hostState describes the network of the namespace the test runs in (the
// real host): links, addresses, routes of every table, rules and the
// nftables ruleset (iptables-nft rules included). Runtimes driven by the
// suite must leave it as it was.
func hostState(t *testing.T) []string {
	t.Helper()
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var s []string
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		a := l.Attrs()
		s = append(s, fmt.Sprintf("link %s %s master=%d up=%t", a.Name, l.Type(), a.MasterIndex, a.Flags&1 != 0))
	}
	addrs, _ := h.AddrList(nil, netlink.FAMILY_ALL)
	for _, a := range addrs {
		s = append(s, fmt.Sprintf("addr %s dev %d", a.IPNet, a.LinkIndex))
	}
	routes, _ := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	for _, r := range routes {
		s = append(s, fmt.Sprintf("route table %d %v via %v dev %d", r.Table, r.Dst, r.Gw, r.LinkIndex))
	}
	rules, _ := h.RuleList(netlink.FAMILY_ALL)
	for _, r := range rules {
		s = append(s, fmt.Sprintf("rule prio %d table %d", r.Priority, r.Table))
	}
	if out, err := exec.Command("nft", "list", "ruleset").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			s = append(s, "nft "+line)
		}
	}
	slices.Sort(s)
	return s
}

func assertHostSame(t *testing.T, before []string, when string) {
	t.Helper()
	after := hostState(t)
	var gone, added []string
	for _, x := range before {
		if !slices.Contains(after, x) {
			gone = append(gone, x)
		}
	}
	for _, x := range after {
		if !slices.Contains(before, x) {
			added = append(added, x)
		}
	}
	if len(gone)+len(added) > 0 {
		t.Errorf("the host's own network changed %s:\n  gone:  %s\n  added: %s", when,
			strings.Join(gone, "\n         "), strings.Join(added, "\n         "))
	}
}
