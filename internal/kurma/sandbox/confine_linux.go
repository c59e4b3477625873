package sandbox

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
)

// PluginCapabilities is everything a sandboxed executable may hold: its
// bounding, permitted and effective sets (nothing inheritable or ambient).
// Measured, not guessed: the reference CNI plugins (bridge, macvlan, ptp,
// host-local, loopback...) packed into images and run through the sandbox
// (internal/kurma/pack TestSandboxedPlugins, test/kurma) pass with exactly
// this set, and fail without either of the first two (internal/kurma/pack
// TestCapabilitiesNeeded takes each away in turn):
//
//   - CAP_NET_ADMIN: links, addresses, routes, sysctls under /proc/sys/net;
//   - CAP_SYS_ADMIN: setns(2) into the pod's network namespace (the kernel
//     asks for it on top of CAP_NET_ADMIN); what else it would allow is cut
//     off by the seccomp filter (no mount, no namespaces other than
//     network ones, no bpf...);
//   - CAP_NET_RAW and CAP_NET_BIND_SERVICE: none of the measured plugins
//     needs them; they are kept for plugins the test cannot run (the DHCP
//     plugin's packet sockets, iptables-legacy's raw socket, a main exec
//     serving DHCP or DNS on a port below 1024). Dropping them would be
//     a guess the other way.
//
// Left out, among others: CAP_DAC_READ_SEARCH (open_by_handle_at reaches
// any file of a host file system the sandbox shows, by a made-up handle),
// CAP_DAC_OVERRIDE, CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYS_BOOT,
// CAP_SYS_PTRACE, CAP_SYS_TIME, CAP_MKNOD, CAP_SETUID, CAP_SETGID,
// CAP_SETPCAP, CAP_SYS_RESOURCE, CAP_SYS_CHROOT.
var PluginCapabilities = []int{
	unix.CAP_NET_ADMIN,
	unix.CAP_SYS_ADMIN,
	unix.CAP_NET_RAW,
	unix.CAP_NET_BIND_SERVICE,
}

func capMask(caps []int) uint64 {
	var m uint64
	for _, c := range caps {
		m |= 1 << c
	}
	return m
}

// rlimits are the resource limits of every call. RLIMIT_NPROC is not among
// them: the kernel never applies it to uid 0 (nor to CAP_SYS_ADMIN), and it
// would count all of root's processes on the host anyway; the call's pids
// cgroup is the limit that holds.
func (o Options) rlimits() []sandboxinit.Rlimit {
	return []sandboxinit.Rlimit{
		{Resource: unix.RLIMIT_CORE, Limit: 0},
		{Resource: unix.RLIMIT_NOFILE, Limit: uint64(o.NoFileLimit)},
	}
}

// The seccomp filter is a deny list: a plugin may use any system call
// except these, which fail with EPERM. Kept short on purpose (a plugin's
// needs are open-ended; an allow list would break plugins in ways nobody
// tested), it closes what the remaining capabilities would otherwise open:
//
//   - the mount family (mount, umount2, pivot_root and the new mount API):
//     with CAP_SYS_ADMIN a plugin could otherwise unmount the masks over
//     /proc, remount /proc/sys writable or mount a fresh procfs. A plugin
//     that mounts (one that pins namespaces itself, `ip netns exec`) does
//     not work in the sandbox; the caller pins namespaces;
//   - setns(2) into anything but a network namespace, and new user
//     namespaces (unshare, clone with CLONE_NEWUSER; clone3, whose flags a
//     filter cannot read, fails with ENOSYS so libc falls back to clone);
//   - kernel modules, kexec, reboot, swap, accounting, quotas, bpf,
//     perf_event_open, fanotify, keyrings, userfaultfd, the kernel log,
//     clocks, host and domain names (the UTS namespace is the host's), port
//     I/O;
//   - open_by_handle_at (also stopped by the missing CAP_DAC_READ_SEARCH;
//     name_to_handle_at is harmless and allowed).
//
// Any other architecture's system calls (i386 through int 0x80 on x86-64,
// say, where the numbers differ and a deny list would not hold) kill the
// process; so do x32 calls. A library (github.com/elastic/go-seccomp-bpf)
// was considered: its programs let foreign-architecture calls through to
// the default action, which for a deny list is "allow".
var deniedSyscalls = append([]uintptr{
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_MOVE_MOUNT,
	unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR, unix.SYS_FSOPEN, unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_REBOOT,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_FANOTIFY_INIT, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_USERFAULTFD,
	unix.SYS_SYSLOG, unix.SYS_SETHOSTNAME, unix.SYS_SETDOMAINNAME, unix.SYS_VHANGUP,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
}, archDenied...)

// seccompFilter assembles the filter as the init loads it: sock_filter
// entries, 8 little-endian bytes each.
func seccompFilter() ([]byte, error) {
	if auditArch == 0 {
		return nil, fmt.Errorf("no seccomp filter for this architecture")
	}
	const (
		ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret   = unix.BPF_RET | unix.BPF_K
		// struct seccomp_data: nr, arch, instruction pointer, args (the
		// low half of each first: little-endian only).
		offNr   = 0
		offArch = 4
		offArg0 = 16
		offArg1 = 24

		allow = unix.SECCOMP_RET_ALLOW
		eperm = unix.SECCOMP_RET_ERRNO | uint32(syscall.EPERM)
		kill  = unix.SECCOMP_RET_KILL_PROCESS
	)
	enosys := uint32(unix.SECCOMP_RET_ERRNO | uint32(syscall.ENOSYS))
	var p []unix.SockFilter
	ins := func(code uint16, k uint32, jt, jf uint8) {
		p = append(p, unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k})
	}
	ins(ldAbs, offArch, 0, 0)
	ins(jeq, auditArch, 1, 0)
	ins(ret, kill, 0, 0)
	ins(ldAbs, offNr, 0, 0)
	if x32Bit != 0 {
		ins(jge, x32Bit, 0, 1)
		ins(ret, kill, 0, 0)
	}
	for _, nr := range deniedSyscalls {
		ins(jeq, uint32(nr), 0, 1)
		ins(ret, eperm, 0, 0)
	}
	ins(jeq, unix.SYS_CLONE3, 0, 1)
	ins(ret, enosys, 0, 0)
	// setns(fd, nstype): network namespaces only (nstype 0, "whatever fd
	// is", is refused too: the plugin libraries all say CLONE_NEWNET).
	ins(jeq, unix.SYS_SETNS, 0, 4)
	ins(ldAbs, offArg1, 0, 0)
	ins(jeq, unix.CLONE_NEWNET, 1, 0)
	ins(ret, eperm, 0, 0)
	ins(ret, allow, 0, 0)
	// unshare(flags) and clone(flags, ...): no new user namespace.
	for _, nr := range []uint32{unix.SYS_UNSHARE, unix.SYS_CLONE} {
		ins(jeq, nr, 0, 4)
		ins(ldAbs, offArg0, 0, 0)
		ins(jset, unix.CLONE_NEWUSER, 0, 1)
		ins(ret, eperm, 0, 0)
		ins(ret, allow, 0, 0)
	}
	ins(ret, allow, 0, 0)

	raw := make([]byte, 0, 8*len(p))
	for _, f := range p {
		raw = binary.LittleEndian.AppendUint16(raw, f.Code)
		raw = append(raw, f.Jt, f.Jf)
		raw = binary.LittleEndian.AppendUint32(raw, f.K)
	}
	return raw, nil
}

// canLowerNice reports whether this process may lower a thread's nice
// value: whether it holds CAP_SYS_NICE where the kernel looks for it (in
// the initial user namespace; a capability set inside a user namespace
// says yes and the kernel no). It tries, on a thread of its own that ends
// with the goroutine whatever its nice value then.
func canLowerNice() bool {
	ok := make(chan bool, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		nice := 20 - prio // the raw system call answers 20 - nice
		if err != nil || nice >= aheadNice {
			ok <- false
			return
		}
		if unix.Setpriority(unix.PRIO_PROCESS, 0, nice+1) != nil {
			ok <- false
			return
		}
		ok <- unix.Setpriority(unix.PRIO_PROCESS, 0, nice) == nil
	}()
	return <-ok
}
