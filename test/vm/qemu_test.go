package vm

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/guest"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
	"github.com/skeinnet/skein/test/tools"
)

// virtioModules are what the guest loads, in order, to get its NIC.
var virtioModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "failover", "net_failover", "virtio_net"}

// guestInit is the VM's /init: load virtio-net, take a lease with
// udhcpc, show what it configured, ping the target, power off. Lines
// starting "SKEIN-VM" are what the test reads from the console.
const guestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
for m in %s; do [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko; done
ip link set lo up
ip link set eth0 up
echo "SKEIN-VM mac $(cat /sys/class/net/eth0/address)"
if udhcpc -f -q -n -i eth0 -s /udhcpc.script -t 20 -T 1; then echo SKEIN-VM-LEASE-OK; else echo SKEIN-VM-LEASE-FAIL; fi
ip -4 addr show dev eth0 | sed -n 's/^ *inet \([^ ]*\).*/SKEIN-VM addr \1/p'
ip -4 route | sed 's/^/SKEIN-VM route /'
echo "SKEIN-VM mtu $(cat /sys/class/net/eth0/mtu)"
if ping -c 3 -W 3 %s; then echo SKEIN-VM-PING-OK; else echo SKEIN-VM-PING-FAIL; fi
poweroff -f
`

// guestFiles finds the cached kernel and the virtio modules, or skips.
func guestFiles(t *testing.T) (kernel string, modules map[string]string) {
	t.Helper()
	cache := filepath.Join(tools.KernelCache(), "current")
	ks, _ := filepath.Glob(filepath.Join(cache, "boot", "vmlinuz-*"))
	if len(ks) == 0 {
		t.Skipf("skipping: no Debian kernel under %s (scripts/install-deps.sh downloads it)", cache)
	}
	modules = map[string]string{}
	_ = filepath.WalkDir(filepath.Join(cache, "lib", "modules"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ko") {
			modules[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return nil
	})
	if modules["virtio_net"] == "" {
		t.Skipf("skipping: the cached kernel under %s has no virtio_net module", cache)
	}
	return ks[0], modules
}

// initramfs builds a gzip'd newc cpio with busybox, the modules and init.
func initramfs(t *testing.T, modules map[string]string, target string) string {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("skipping: busybox (busybox-static) is not installed")
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "lib/modules", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile := func(src, dst string, mode os.FileMode) {
		b, err := os.ReadFile(src)
		if err == nil {
			err = os.WriteFile(filepath.Join(root, dst), b, mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	copyFile(busybox, "bin/busybox", 0o755)
	for _, m := range virtioModules {
		if p := modules[m]; p != "" {
			copyFile(p, "lib/modules/"+m+".ko", 0o644)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(fmt.Sprintf(guestInit, strings.Join(virtioModules, " "), target)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "udhcpc.script"), []byte(guest.UdhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initrd.gz")
	cmd := exec.Command("sh", "-c", "find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build initramfs: %v\n%s", err, b)
	}
	return out
}

// TestRealVM: a qemu VM (TCG) started by skein-vmwrapper with the tap
// descriptor from skeind gets its lease over the tap and pings another
// pod of the same skein pool. The guest's console is the evidence.
func TestRealVM(t *testing.T) {
	qemu := skeintest.RequireTool(t, "qemu-system-x86_64")
	kernel, modules := guestFiles(t)
	e := newEnv(t)

	// A plain container pod on the same pool: the VM's ping target.
	other := harness.NewNS(t, "other")
	plain := skeintest.ConfList(t, "vm-real", "1.1.0", e.d.SkeinPlugin(nil))
	ort := skeintest.RT("plain", other.Path(), "eth0")
	ores, err := e.add(plain, ort)
	if err != nil {
		t.Fatalf("ADD the target pod: %v", err)
	}
	t.Cleanup(func() { _ = e.del(plain, ort) })
	var target string
	for _, ip := range ores.IPs {
		if ip.Address.IP.To4() != nil {
			target = ip.Address.IP.String()
		}
	}

	l := e.skeinChain(t, "vm-real", "1.1.0", nil)
	p := e.mustAddVM(t, l, "realvm", [2]string{"K8S_POD_NAME", "realvm"})
	initrd := initramfs(t, modules, target)

	launcher := harness.NewNS(t, "launcher") // qemu needs no network of its own
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.d.BinDir, "skein-vmwrapper"),
		"-accel", "tcg", "-m", "256", "-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 quiet")
	cmd.Env = append(os.Environ(),
		"SKEIN_VM_CONTAINER_ID=realvm", "SKEIN_VM_EMULATOR="+qemu,
		"SKEIN_VM_SOCKET="+e.vmSocket(), "SKEIN_VM_TOKEN_DIR="+e.tokenDir(), "SKEIN_VM_NIC_OPTS=romfile=")
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	start := time.Now()
	if err := launcher.Do(cmd.Run); err != nil {
		t.Fatalf("VM run failed after %v: %v\nconsole:\n%s", time.Since(start).Round(time.Millisecond), err, console.String())
	}
	out := console.String()
	t.Logf("VM ran %v", time.Since(start).Round(time.Millisecond))
	var got []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "SKEIN-VM") {
			got = append(got, strings.TrimSpace(line))
		}
	}
	report := strings.Join(got, "\n")
	t.Logf("guest console:\n%s", report)
	for _, want := range []string{
		"SKEIN-VM mac " + p.vmMAC,
		"SKEIN-VM-LEASE-OK",
		"SKEIN-VM addr " + p.addr4.String(),
		"SKEIN-VM route default via " + p.gw4.String(),
		fmt.Sprintf("SKEIN-VM mtu %d", podMTU),
		"SKEIN-VM-PING-OK",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("guest console lacks %q; the guest reported:\n%s\nfull console:\n%s", want, report, out)
			break
		}
	}
}
