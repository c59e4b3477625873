package main

// The VM part. Its pod is attached through libcni with skein and then
// skein-vm chained after it: skeind moves the pod's interface onto a
// bridge with a tap and serves the VM the pod's addresses over DHCPv4,
// DHCPv6 and router advertisements. Then either
//
//   - qemu: skein-vmwrapper fetches the tap from skeind and execs qemu
//     (TCG) with it; the guest (the Debian kernel scripts/deps.d/vm.sh
//     caches, a busybox initramfs built here as test/vm builds it) takes
//     its leases with udhcpc and dhclient -6, pings every address given
//     on its kernel command line (skein.ping=a,b,…), reports each line on
//     the serial console as "SKEIN-VM …", and stays up answering pings
//     until the demo stops qemu. Reading results from the console needs
//     no channel into the guest, and the guest needs no network of the
//     demo's to report over.
//   - the stand-in (no qemu or no cached kernel): the VM side test/vm
//     uses, a namespace whose veth, with the VM's MAC, is a port of the
//     pod's bridge next to the tap; busybox udhcpc and dhclient -6 run
//     there as they would in the guest.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/tools"
)

// virtioModules are what the guest loads, in order, to get its NIC.
var virtioModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "failover", "net_failover", "virtio_net"}

const dhclient = "/usr/sbin/dhclient"

// guest is what a qemu VM needs, found on the host.
type guest struct {
	qemu, kernel string
	modules      map[string]string // name → .ko path
	libs         []string          // dhclient's shared libraries and loader
}

// findGuest returns what the qemu VM needs, or why it cannot run.
func findGuest() (*guest, string) {
	g := &guest{modules: map[string]string{}}
	var err error
	if g.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, "qemu-system-x86_64 is not installed (scripts/install-deps.sh demo installs qemu-system-x86)"
	}
	cache := filepath.Join(tools.KernelCache(), "current")
	ks, _ := filepath.Glob(filepath.Join(cache, "boot", "vmlinuz-*"))
	if len(ks) == 0 {
		return nil, fmt.Sprintf("no Debian kernel is cached under %s (scripts/install-deps.sh demo downloads it)", cache)
	}
	g.kernel = ks[0]
	_ = filepath.WalkDir(filepath.Join(cache, "lib", "modules"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ko") {
			g.modules[strings.TrimSuffix(e.Name(), ".ko")] = p
		}
		return nil
	})
	if g.modules["virtio_net"] == "" {
		return nil, fmt.Sprintf("the kernel cached under %s has no virtio_net module", cache)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return nil, "/bin/busybox is missing, the guest's userland (apt-get install busybox-static)"
	}
	if _, err := os.Stat(dhclient); err != nil {
		return nil, dhclient + " is missing, the guest's DHCPv6 client (apt-get install isc-dhcp-client)"
	}
	out, err := exec.Command("ldd", dhclient).Output()
	if err != nil {
		return nil, fmt.Sprintf("ldd %s: %v", dhclient, err)
	}
	// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and
	// "/lib64/ld-linux-x86-64.so.2 (0x…)"
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				g.libs = append(g.libs, f)
				break
			}
		}
	}
	return g, ""
}

// standInMissing says why the stand-in cannot run, or "".
func standInMissing() string {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return "/bin/busybox is missing, its udhcpc is the stand-in's DHCPv4 client (apt-get install busybox-static)"
	}
	if _, err := os.Stat(dhclient); err != nil {
		return dhclient + " is missing, the stand-in's DHCPv6 client (apt-get install isc-dhcp-client)"
	}
	return ""
}

func (d *demo) addVM(ctx context.Context, c *cleanup) error {
	var g *guest
	why := ""
	if d.vmMode != "standin" {
		g, why = findGuest()
		if g == nil && d.vmMode == "qemu" {
			return fmt.Errorf("-vm qemu: %s", why)
		}
	} else {
		why = "-vm standin"
	}
	if g != nil {
		fmt.Println("\n== a VM: skein then skein-vm through libcni; qemu (TCG) started by skein-vmwrapper with the tap skeind hands over")
	} else {
		fmt.Println("\n== a VM stand-in: skein then skein-vm through libcni; DHCP clients in a namespace bridged next to the tap")
		if miss := standInMissing(); miss != "" {
			d.skip("the VM: no qemu VM (%s), and no stand-in either (%s)", why, miss)
			return nil
		}
		fmt.Printf("   NOT a real VM: %s; the stand-in test/vm uses takes its place\n", why)
	}

	ns, err := newNS(c, "vm1")
	if err != nil {
		return err
	}
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": netName, "plugins": []any{
		map[string]any{"type": "skein", "socket": d.sock},
		map[string]any{"type": "skein-vm", "socket": d.sock},
	}})
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: "demo-vm1", NetNS: ns, IfName: "eth0"}
	start := time.Now()
	r, err := d.cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		return fmt.Errorf("ADD vm1 (skein, skein-vm): %w", err)
	}
	took := time.Since(start)
	c.add(func() error {
		if err := d.cni.DelNetworkList(context.Background(), list, rt); err != nil {
			return fmt.Errorf("DEL vm1: %w", err)
		}
		fmt.Println("   DEL vm1 ok")
		return nil
	})
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return err
	}
	var tap, bridge, mac string
	for _, i := range res.Interfaces {
		switch {
		case strings.HasPrefix(i.Name, "sktap"):
			tap, mac = i.Name, i.Mac
		case strings.HasPrefix(i.Name, "skbr"):
			bridge = i.Name
		}
	}
	if tap == "" || bridge == "" || mac == "" {
		return fmt.Errorf("ADD vm1: the result names no tap or bridge: %+v", res.Interfaces)
	}
	m := &member{name: "vm1", detail: fmt.Sprintf("tap %s on bridge %s in its pod", tap, bridge)}
	m.v4, m.v6 = resultAddrs(res)
	fmt.Printf("   ADD vm1 ok in %v: %v %v, MAC %s, %s\n", took.Round(100*time.Microsecond), m.v4, m.v6, mac, m.detail)

	if g != nil {
		m.kind = "VM (qemu)"
		err = d.bootVM(ctx, c, g, m)
	} else {
		m.kind = "VM (stand-in)"
		err = d.standIn(ctx, c, ns, bridge, mac, m)
	}
	if err != nil {
		return err
	}
	d.members = append(d.members, m)
	return nil
}

// The guest's /init. Lines starting "SKEIN-VM" are what the demo reads.
const guestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
say() { echo "SKEIN-VM $*"; }
for m in %s; do [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko; done
# No duplicate address detection: dhclient -6 binds to the link-local
# address at once, and the leased address is usable at once.
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
ip link set lo up
ip link set eth0 up
say mac $(cat /sys/class/net/eth0/address)
if udhcpc -f -q -n -i eth0 -s /udhcpc.script -t 20 -T 1 >/dev/null 2>&1; then say lease4 ok; else say lease4 fail; fi
i=0; while [ $i -lt 50 ] && ! ip -6 addr show dev eth0 | grep -q 'inet6 fe80'; do usleep 100000; i=$((i+1)); done
if dhclient -6 -1 -cf /etc/dhclient.conf -sf /dhclient6.script -lf /tmp/dhclient6.leases -pf /tmp/dhclient6.pid eth0 >/dev/null 2>&1; then say lease6 ok; else say lease6 fail; fi
i=0; while [ $i -lt 100 ] && ! ip -6 route | grep -q '^default'; do usleep 100000; i=$((i+1)); done
ip -o addr show dev eth0 | sed -n 's/.* inet6\{0,1\} \([^ ]*\) .*scope global.*/SKEIN-VM addr \1/p'
ip route | sed -n 's/^default/SKEIN-VM route4 default/p'
ip -6 route | sed -n 's/^default/SKEIN-VM route6 default/p'
for a in $(sed -n 's/.*skein\.ping=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' '); do
	r=fail
	for i in 1 2 3; do if ping -c 1 -W 1 $a >/dev/null 2>&1; then r=ok; break; fi; done
	say ping $a $r
done
say ready $(cut -d" " -f1 /proc/uptime)
while :; do sleep 3600; done
`

// udhcpcScript configures what udhcpc leased (address, MTU, option 121
// routes); busybox's ip, so it runs the same in the guest and on the host.
const udhcpcScript = `#!/bin/sh
IP="/bin/busybox ip"
case "$1" in
deconfig) $IP -4 addr flush dev "$interface" ;;
bound|renew)
	$IP addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && $IP link set dev "$interface" mtu "$mtu"
	set -- $staticroutes
	while [ $# -ge 2 ]; do
		if [ "$2" = 0.0.0.0 ]; then $IP route add "$1" dev "$interface"; else $IP route add "$1" via "$2" dev "$interface"; fi
		shift 2
	done ;;
esac
exit 0
`

// dhclient6Script adds the leased IPv6 address; the router advertisements
// give the default route.
const dhclient6Script = `#!/bin/sh
case "$reason" in
BOUND6|RENEW6|REBIND6|REBOOT6) /bin/busybox ip -6 addr add "$new_ip6_address/$new_ip6_prefixlen" dev "$interface" ;;
esac
exit 0
`

// dhclientConf: give up after 20 s rather than dhclient's 60.
const dhclientConf = "timeout 20;\n"

// initramfs builds the guest's gzip'd newc cpio: busybox, the virtio
// modules, dhclient with its libraries, /init and the client scripts.
func (g *guest) initramfs(dir string) (string, error) {
	root := filepath.Join(dir, "root")
	for _, sub := range []string{"bin", "sbin", "proc", "sys", "dev", "tmp", "lib/modules", "etc", "var/lib/dhcp", "run"} {
		if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
			return "", err
		}
	}
	copyFile := func(src, dst string, mode os.FileMode) error {
		b, err := os.ReadFile(src)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(filepath.Join(root, dst)), 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(root, dst), b, mode)
		}
		return err
	}
	files := [][2]string{{"/bin/busybox", "bin/busybox"}, {dhclient, "sbin/dhclient"}}
	for _, l := range g.libs {
		files = append(files, [2]string{l, strings.TrimPrefix(l, "/")})
	}
	for _, f := range files {
		if err := copyFile(f[0], f[1], 0o755); err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
	}
	for _, m := range virtioModules {
		if p := g.modules[m]; p != "" {
			if err := copyFile(p, "lib/modules/"+m+".ko", 0o644); err != nil {
				return "", fmt.Errorf("initramfs: %w", err)
			}
		}
	}
	for _, f := range []struct {
		name, body string
		mode       os.FileMode
	}{
		{"init", fmt.Sprintf(guestInit, strings.Join(virtioModules, " ")), 0o755},
		{"udhcpc.script", udhcpcScript, 0o755},
		{"dhclient6.script", dhclient6Script, 0o755},
		{"etc/dhclient.conf", dhclientConf, 0o644},
	} {
		if err := os.WriteFile(filepath.Join(root, f.name), []byte(f.body), f.mode); err != nil {
			return "", err
		}
	}
	out := filepath.Join(dir, "initrd.gz")
	cmd := exec.Command("sh", "-c", "find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1 > "+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build initramfs: %v\n%s", err, b)
	}
	return out, nil
}

// bootVM starts the guest through skein-vmwrapper and waits until it has
// its leases and has pinged the others.
func (d *demo) bootVM(ctx context.Context, c *cleanup, g *guest, m *member) error {
	dir := filepath.Join(d.dir, "vm")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	initrd, err := g.initramfs(dir)
	if err != nil {
		return err
	}
	var targets []string
	for _, o := range d.members {
		for _, a := range o.addrs() {
			targets = append(targets, a.String())
		}
	}
	console, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		return err
	}
	cmd := ownGroup(exec.Command(filepath.Join(d.bin, "skein-vmwrapper"),
		"-accel", "tcg", "-m", "256", "-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", g.kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet skein.ping="+strings.Join(targets, ",")))
	cmd.Env = append(os.Environ(),
		"SKEIN_VM_CONTAINER_ID=demo-vm1", "SKEIN_VM_EMULATOR="+g.qemu,
		"SKEIN_VM_SOCKET="+filepath.Join(d.dir, "vm.sock"), "SKEIN_VM_TOKEN_DIR="+filepath.Join(d.dir, "vm-tokens"),
		"SKEIN_VM_NIC_OPTS=romfile=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = console
	start := time.Now()
	// qemu needs no network of its own: it runs in the node namespace,
	// so it has nothing of the host's either.
	if err := netns.Do(d.node, cmd.Start); err != nil {
		console.Close()
		return fmt.Errorf("start skein-vmwrapper: %w", err)
	}
	fmt.Printf("   skein-vmwrapper → %s -accel tcg -kernel %s (pid %d); the guest pings %d addresses\n",
		filepath.Base(g.qemu), g.kernel, cmd.Process.Pid, len(targets))
	// The reader owns the pipe and then reaps qemu (Wait only after the
	// last read). The guest writes a few dozen SKEIN-VM lines at most.
	lines, exited := make(chan string, 1024), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			fmt.Fprintln(console, line)
			if i := strings.Index(line, "SKEIN-VM "); i >= 0 {
				lines <- line[i:]
			}
		}
		close(lines)
		_ = cmd.Wait()
		close(exited)
	}()
	c.add(func() error {
		defer console.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			fmt.Println("   qemu stopped")
			return nil
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("qemu did not exit within 10s of SIGTERM (killed)")
		}
	})

	var report []string
	timeout := time.After(100 * time.Second)
	for ready := false; !ready; {
		select {
		case line, ok := <-lines:
			if !ok {
				<-exited
				return fmt.Errorf("the VM stopped before it was ready; console (%s):\n%s", console.Name(), tailFile(console.Name(), 30))
			}
			report = append(report, line)
			ready = strings.HasPrefix(line, "SKEIN-VM ready")
		case <-timeout:
			return fmt.Errorf("the VM was not ready within 100s; console (%s):\n%s", console.Name(), tailFile(console.Name(), 30))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	uptime := strings.TrimPrefix(report[len(report)-1], "SKEIN-VM ready ")
	fmt.Printf("   guest ready %v after launch (%ss after its kernel started); what it reported on its console:\n",
		time.Since(start).Round(100*time.Millisecond), uptime)
	for _, l := range report {
		if !strings.HasPrefix(l, "SKEIN-VM ping") && !strings.HasPrefix(l, "SKEIN-VM ready") {
			fmt.Println("     " + strings.TrimPrefix(l, "SKEIN-VM "))
		}
	}
	got := strings.Join(report, "\n")
	for _, want := range []string{"SKEIN-VM lease4 ok", "SKEIN-VM lease6 ok"} {
		if !strings.Contains(got, want) {
			return fmt.Errorf("the guest reports no %q; console (%s):\n%s", strings.TrimPrefix(want, "SKEIN-VM "), console.Name(), tailFile(console.Name(), 30))
		}
	}
	for _, a := range m.addrs() {
		if !strings.Contains(got, "SKEIN-VM addr "+a.String()+"/") {
			return fmt.Errorf("the guest did not configure %s, the address of its CNI result; it reported:\n%s", a, got)
		}
	}
	results := parsePingLines(got, "SKEIN-VM ping ")
	m.ping = func(context.Context, []netip.Addr) (map[netip.Addr]bool, error) { return results, nil }
	return nil
}

// standIn gives the VM's pod the stand-in VM side and runs the DHCP
// clients there.
func (d *demo) standIn(ctx context.Context, c *cleanup, pod, bridge, mac string, m *member) error {
	vm, err := newNS(c, "vm1-standin")
	if err != nil {
		return err
	}
	ifName, port := "vm"+randHex(3), "vp"+randHex(3)
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	h, closeH, err := netns.Handle(pod)
	if err != nil {
		return err
	}
	defer closeH()
	br, err := h.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	vmFd, err := os.Open(vm)
	if err != nil {
		return err
	}
	defer vmFd.Close()
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: port, MTU: br.Attrs().MTU, MasterIndex: br.Attrs().Index, TxQLen: -1},
		PeerName:  ifName, PeerHardwareAddr: hw, PeerMTU: uint32(br.Attrs().MTU), PeerNamespace: netlink.NsFd(vmFd.Fd()),
	}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("stand-in veth: %w", err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		return err
	}
	if err := netns.WriteSysctl(vm, "net/ipv6/conf/"+ifName+"/accept_dad", "0"); err != nil {
		return err
	}
	vh, closeV, err := netns.Handle(vm)
	if err != nil {
		return err
	}
	defer closeV()
	link, err := vh.LinkByName(ifName)
	if err == nil {
		err = vh.LinkSetUp(link)
	}
	if err != nil {
		return fmt.Errorf("stand-in interface up: %w", err)
	}

	dir := filepath.Join(d.dir, "vm")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, []byte(body), 0o755)
		return p
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []byte
	err = netns.Do(vm, func() error {
		out, err = exec.CommandContext(cctx, "/bin/busybox", "udhcpc", "-f", "-q", "-n", "-i", ifName,
			"-s", script("udhcpc.script", udhcpcScript), "-t", "10", "-T", "1").CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("udhcpc in the stand-in: %w\n%s", err, out)
	}
	fmt.Printf("   udhcpc (busybox) leased IPv4 in %v\n", time.Since(start).Round(time.Millisecond))

	// dhclient -6 binds to the link-local address, which the kernel adds
	// once the link has carrier.
	start = time.Now()
	if err := waitUntil(ctx, 5*time.Second, func() bool { return hasLinkLocal(vh, link) }); err != nil {
		return fmt.Errorf("no link-local address on the stand-in's interface: %w", err)
	}
	logf, err := os.Create(filepath.Join(dir, "dhclient6.log"))
	if err != nil {
		return err
	}
	cmd := ownGroup(exec.Command(dhclient, "-d", "-6", "-cf", script("dhclient.conf", dhclientConf),
		"-sf", script("dhclient6.script", dhclient6Script),
		"-lf", filepath.Join(dir, "dhclient6.leases"), "-pf", filepath.Join(dir, "dhclient6.pid"), ifName))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := netns.Do(vm, cmd.Start); err != nil {
		logf.Close()
		return fmt.Errorf("start dhclient -6 in the stand-in: %w", err)
	}
	c.add(func() error {
		defer logf.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		return nil
	})
	if err := waitUntil(ctx, 20*time.Second, func() bool { return hasAddr(vh, link, m.v6) }); err != nil {
		return fmt.Errorf("dhclient -6 in the stand-in configured no %s: %w\n%s", m.v6, err, tailFile(logf.Name(), 20))
	}
	if err := waitUntil(ctx, 10*time.Second, func() bool { return hasDefault6(vh, link) }); err != nil {
		return fmt.Errorf("no IPv6 default route from skeind's router advertisements in the stand-in: %w", err)
	}
	fmt.Printf("   dhclient -6 leased IPv6 in %v; the router advertisements gave the default route\n", time.Since(start).Round(time.Millisecond))
	for _, a := range m.addrs() {
		if !hasAddr(vh, link, a) {
			return fmt.Errorf("the stand-in did not configure %s, the address of its CNI result", a)
		}
	}
	m.ping = nsPinger(vm)
	return nil
}

func hasAddr(h *netlink.Handle, l netlink.Link, a netip.Addr) bool {
	addrs, _ := h.AddrList(l, netlink.FAMILY_ALL)
	for _, x := range addrs {
		if y, ok := netip.AddrFromSlice(x.IP); ok && y.Unmap() == a {
			return true
		}
	}
	return false
}

func hasLinkLocal(h *netlink.Handle, l netlink.Link) bool {
	addrs, _ := h.AddrList(l, netlink.FAMILY_V6)
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
			return true
		}
	}
	return false
}

func hasDefault6(h *netlink.Handle, l netlink.Link) bool {
	routes, _ := h.RouteList(l, netlink.FAMILY_V6)
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() == "::/0" {
			return true
		}
	}
	return false
}

func waitUntil(ctx context.Context, d time.Duration, ok func() bool) error {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		if ok() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("not within %v", d)
}
