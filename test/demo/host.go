package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostState is what the demo promises not to change on the host: every
// line describes one thing (a namespace, link, address, route, rule,
// nftables table, mount, forwarding switch or file) in the namespaces the
// demo itself runs in. It reads only; it is taken before the demo creates
// anything and again after cleanup.
//
// test/harness.Snapshot compares test namespaces the same way, but it
// takes a testing.TB and a harness.NS; this is the host-side subset the
// demo needs, plus what a dockerd and a qemu could leave on the host.
type hostState []string

// watchedPaths are files and directories outside the demo's temporary
// directory that dockerd, containerd or dhclient could create: their
// existence and (for directories) their entries are part of the state.
var watchedPaths = []string{
	"/run/netns", "/run/docker", "/run/docker/plugins", "/run/containerd",
	"/var/run/docker.sock", "/var/lib/docker", "/var/lib/containerd", "/etc/docker",
	"/var/lib/dhcp", "/run/skein",
}

func snapshotHost() (hostState, error) {
	var st []string
	add := func(format string, a ...any) { st = append(st, fmt.Sprintf(format, a...)) }

	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("host netlink: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("host links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		add("link %s type=%s mtu=%d up=%t", a.Name, l.Type(), a.MTU, a.Flags&net.FlagUp != 0)
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("host addresses: %w", err)
	}
	for _, a := range addrs {
		add("addr %s dev %s", a.IPNet, names[a.LinkIndex])
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("host routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.IsMulticast() {
			continue // the kernel's multicast routes come and go with links' state
		}
		add("route table %d %v via %v dev %s", r.Table, r.Dst, r.Gw, names[r.LinkIndex])
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("host rules: %w", err)
	}
	for _, r := range rules {
		add("rule family %d prio %d table %d", r.Family, r.Priority, r.Table)
	}

	nft, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("host nftables: %w", err)
	}
	tables, err := nft.ListTables()
	if err != nil {
		return nil, fmt.Errorf("host nftables tables: %w", err)
	}
	for _, t := range tables {
		add("nft table family %d %s", t.Family, t.Name)
	}

	for _, f := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		b, err := os.ReadFile(filepath.Join("/proc/sys", f))
		if err != nil {
			return nil, fmt.Errorf("host sysctl: %w", err)
		}
		add("sysctl %s=%s", f, strings.TrimSpace(string(b)))
	}

	mounts, err := mountPoints()
	if err != nil {
		return nil, err
	}
	st = append(st, mounts...)

	for _, p := range watchedPaths {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		add("path %s mode=%v", p, fi.Mode().Type())
		if fi.IsDir() {
			ents, _ := os.ReadDir(p)
			for _, e := range ents {
				add("path %s/%s", p, e.Name())
			}
		}
	}
	tmp, _ := filepath.Glob(filepath.Join(os.TempDir(), "skein-demo-*"))
	for _, p := range tmp {
		add("path %s", p)
	}
	slices.Sort(st)
	return st, nil
}

// mountPoints lists the mount table of the demo's mount namespace (the
// host's): one line per mount point and file system type. /run/netns
// itself is left out: like `ip netns add`, the first namespace created on
// a machine may make it a shared bind mount of itself, and that mount is
// meant to stay (see internal/netns).
func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("host mounts: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		if fields[4] == "/run/netns" {
			continue
		}
		out = append(out, fmt.Sprintf("mount %s type %s", fields[4], fields[sep+1]))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("host mounts: %w", err)
	}
	return out, nil
}

// diff returns what only before and only after hold.
func (before hostState) diff(after hostState) (gone, added []string) {
	count := map[string]int{}
	for _, s := range before {
		count[s]++
	}
	for _, s := range after {
		count[s]--
	}
	for s, n := range count {
		for ; n > 0; n-- {
			gone = append(gone, s)
		}
		for ; n < 0; n++ {
			added = append(added, s)
		}
	}
	slices.Sort(gone)
	slices.Sort(added)
	return gone, added
}

// processesOf returns the pids of running processes whose command line
// mentions dir.
func processesOf(dir string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), dir) {
			continue
		}
		out[pid] = strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
	}
	return out
}

// killLeftovers ends the processes processesOf finds: SIGTERM, then
// SIGKILL for those still there a few seconds later.
func killLeftovers(dir string) {
	for pid := range processesOf(dir) {
		_ = unix.Kill(pid, unix.SIGTERM)
	}
	for i := 0; i < 50 && len(processesOf(dir)) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	for pid := range processesOf(dir) {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	for i := 0; i < 20 && len(processesOf(dir)) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// leftoverProcesses lists running processes whose command line mentions
// dir (the demo's temporary directory: every dockerd, containerd, qemu and
// dhclient the demo starts is given a path inside it).
func leftoverProcesses(dir string) []string {
	var out []string
	for pid, cmd := range processesOf(dir) {
		if len(cmd) > 100 {
			cmd = cmd[:100] + "…"
		}
		out = append(out, fmt.Sprintf("pid %d: %s", pid, cmd))
	}
	slices.Sort(out)
	return out
}
