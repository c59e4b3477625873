package guest

import (
	"fmt"
	"strings"
)

// Console markers: lines /init prints around the test binary's run. Run
// reads them from the serial console; everything between runMarker and
// exitMarker is the test binary's output.
const (
	runMarker    = "SKEIN-GUEST-RUN"
	exitMarker   = "SKEIN-GUEST-EXIT"
	moduleMarker = "SKEIN-GUEST-MODULE-FAIL"
	setupMarker  = "SKEIN-GUEST-SETUP-FAIL"
	dmesgMarker  = "SKEIN-GUEST-DMESG"
)

// Guest paths of what Run puts into the initramfs.
const (
	guestBinary  = "/skein/test.bin"
	guestWorkDir = "/skein"
	guestModules = "/lib/modules/skein" // <name>.ko, loaded in the order of guestModList
	guestModList = "/skein/modules"     // a module name a line, "optional" after soft dependencies
)

// initScript is the guest's /init (busybox sh, PID 1). It mounts what
// namespaced tests need (/run/netns on a tmpfs, / shared so that netns
// pins propagate like on a normal host), keeps the kernel's messages off
// the console (they would interleave with the test output), loads the
// modules in order (the first one that fails ends the run, named), runs
// the test binary and prints its exit code, then powers off. The network
// part is empty unless the guest has a NIC (HostPorts). args and env are
// shell-quoted words.
func initScript(args, env []string, network string) string {
	return fmt.Sprintf(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "%[1]s $*"; poweroff -f; }
mount -t proc proc /proc || fail proc
mount -t sysfs sysfs /sys || fail sysfs
mount -t devtmpfs devtmpfs /dev || fail devtmpfs
mount -t tmpfs -o mode=755 tmpfs /run || fail /run
mount -t tmpfs -o mode=1777 tmpfs /tmp || fail /tmp
mkdir -p /run/netns /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount --make-rshared / || fail "make / shared"
echo 3 >/proc/sys/kernel/printk
ip link set lo up || fail "lo up"
while read -r m opt; do
	insmod %[2]s/$m.ko 2>/tmp/insmod.err && continue
	[ "$opt" = optional ] && continue
	echo "%[3]s $m: $(cat /tmp/insmod.err)"; dmesg | tail -n 5 | sed 's/^/%[4]s /'; poweroff -f
done <%[5]s
%[6]s
cd %[7]s
echo "%[8]s $(cut -d' ' -f1 /proc/uptime)"
env %[9]s %[10]s %[11]s
rc=$?
echo
echo "%[12]s $rc $(cut -d' ' -f1 /proc/uptime)"
[ $rc -eq 0 ] || dmesg | tail -n 30 | sed 's/^/%[4]s /'
sync
poweroff -f
`, setupMarker, guestModules, moduleMarker, dmesgMarker, guestModList, network, guestWorkDir,
		runMarker, strings.Join(env, " "), guestBinary, strings.Join(args, " "), exitMarker)
}

// shellQuote makes s one word for sh: single quotes, with embedded single
// quotes closed, escaped and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellQuoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = shellQuote(s)
	}
	return out
}
