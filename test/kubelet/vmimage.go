package kubelet

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/skeinnet/skein/test/guest"
)

// VMImage is the image of a VM pod's container, made here: qemu (the
// host's, with the shared libraries it links and its firmware), the
// cached Debian kernel, a guest initramfs and skein-vmwrapper, which
// starts qemu with the taps skeind made for the pod (SKEIN_VM_IN_POD=1).
const VMImage = "skein.test/qemu:1"

// VM guest paths in the image.
const (
	vmKernel = "/vm/kernel"
	vmInitrd = "/vm/initrd.gz"
)

// vmGuestInit is the guest's /init: virtio-net and virtio-rng (the DHCPv6
// client's transaction IDs come from getrandom, which blocks until the
// kernel's pool is seeded — a TCG guest has no other entropy source to
// speak of), a DHCPv4 lease (busybox
// udhcpc) and a DHCPv6 one (dhcp6c), then it pings every address of the
// kernel parameter skein.ping= until each answers (60 s at most) and
// stays up, answering pings. Lines starting "SKEIN-VM" are the console
// report the test reads (the pod's log).
const vmGuestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
for m in %s; do insmod /lib/modules/$m.ko || echo "SKEIN-VM insmod $m failed"; done
ip link set lo up
ip link set eth0 up
echo "SKEIN-VM mac $(cat /sys/class/net/eth0/address)"
if udhcpc -f -q -n -i eth0 -s /udhcpc.script -t 20 -T 1 >/dev/null 2>&1; then echo SKEIN-VM-LEASE4-OK; else echo SKEIN-VM-LEASE4-FAIL; fi
if a6=$(/bin/dhcp6c eth0 2>/tmp/dhcp6c.err) && ip -6 addr add "$a6/128" dev eth0 2>>/tmp/dhcp6c.err; then echo SKEIN-VM-LEASE6-OK; else echo SKEIN-VM-LEASE6-FAIL; sed 's/^/SKEIN-VM dhcp6c: /' /tmp/dhcp6c.err; fi
ip addr show dev eth0 | sed -n 's/^ *inet6\{0,1\} \([^ ]*\) .*scope global.*/SKEIN-VM addr \1/p'
ip -6 route | sed 's/^/SKEIN-VM route6 /'
for t in $(sed -n 's/.*skein\.ping=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' '); do
	r=FAIL
	for i in $(seq 60); do
		if ping -c 1 -W 1 "$t" >/dev/null 2>&1; then r=OK; break; fi
	done
	echo "SKEIN-VM-PING-$r $t"
done
echo SKEIN-VM-READY
while :; do sleep 3600; done
`

// VMPrerequisites returns why a VM pod cannot run here, "" if it can.
func VMPrerequisites() string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "no qemu-system-x86_64: run scripts/install-deps.sh (make deps)"
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		return "no busybox (busybox-static): run scripts/install-deps.sh (make deps)"
	}
	if _, err := guest.CurrentKernel(); err != nil {
		return fmt.Sprintf("no cached guest kernel (%v): run scripts/install-deps.sh (make deps)", err)
	}
	return ""
}

// vmImage writes VMImage as a tarball into dir.
func vmImage(t testing.TB, dir, binDir, moduleRoot string) string {
	t.Helper()
	files := map[string]string{} // path in the image -> file on the host
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	files["/usr/bin/qemu-system-x86_64"] = qemu
	// qemu loads its TCG accelerator as a module (Debian builds it so).
	elves := []string{qemu}
	mods, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-*.so")
	for _, m := range mods {
		files[m] = m
		elves = append(elves, m)
	}
	// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" and the loader
	// "/lib64/ld-linux-x86-64.so.2 (0x…)".
	libRE := regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x`)
	for _, e := range elves {
		out, err := exec.Command("ldd", e).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", e, err)
		}
		for _, m := range libRE.FindAllStringSubmatch(string(out), -1) {
			files[m[1]] = m[1]
		}
	}
	// qemu's firmware (option ROMs, SeaBIOS), links followed.
	for _, share := range []string{"/usr/share/qemu", "/usr/share/seabios"} {
		_ = filepath.WalkDir(share, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files[p] = p
			}
			return nil
		})
	}
	k, err := guest.CurrentKernel()
	if err != nil {
		t.Fatal(err)
	}
	files[vmKernel] = k.Image
	files["/usr/local/bin/skein-vmwrapper"] = filepath.Join(binDir, "skein-vmwrapper")
	initrd := filepath.Join(dir, "vm-initrd.gz")
	vmInitramfs(t, k, initrd, moduleRoot)
	files[vmInitrd] = initrd

	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		for d := filepath.Dir(p); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	dl := make([]string, 0, len(dirs))
	for d := range dirs {
		dl = append(dl, d)
	}
	sort.Strings(dl)
	for _, d := range dl {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range paths {
		b, err := os.ReadFile(files[p]) // follows links
		if err != nil {
			t.Fatalf("VM image: %v", err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "qemu-image.tar")
	if err := writeImage(img, VMImage, layer.Bytes(), v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Entrypoint: []string{"/usr/local/bin/skein-vmwrapper"},
	}); err != nil {
		t.Fatal(err)
	}
	return img
}

// vmInitramfs writes the guest's initramfs (gzip'd newc cpio): busybox,
// dhcp6c, virtio-net's modules and what they need, /init and the udhcpc
// script.
func vmInitramfs(t testing.TB, k *guest.Kernel, out, moduleRoot string) {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	mods, err := k.Resolve([]string{"virtio_pci", "virtio_net", "virtio_rng"})
	if err != nil {
		t.Fatalf("guest modules: %v", err)
	}
	root := filepath.Join(filepath.Dir(out), "vm-initramfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "lib/modules", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin", "busybox")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(root, "bin", "dhcp6c"), "./test/kubelet/dhcp6c")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build dhcp6c: %v\n%s", err, b)
	}
	var names []string
	for _, m := range mods {
		if err := copyFile(m.Path, filepath.Join(root, "lib", "modules", m.Name+".ko")); err != nil {
			t.Fatal(err)
		}
		names = append(names, m.Name)
	}
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(fmt.Sprintf(vmGuestInit, strings.Join(names, " "))), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "udhcpc.script"), []byte(guest.UdhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	var cpio bytes.Buffer
	c := exec.Command("sh", "-c", "find . | busybox cpio -o -H newc 2>/dev/null")
	c.Dir = root
	c.Stdout = &cpio
	if err := c.Run(); err != nil {
		t.Fatalf("initramfs: %v", err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(cpio.Bytes())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
