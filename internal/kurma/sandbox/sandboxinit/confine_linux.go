package sandboxinit

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The confinement the init applies (the sandbox decides what it is; the
// init only carries it out). Everything here is per thread except the
// cgroups and rlimits, so enter locks the thread it runs on and execs from
// it.

// Rlimit is one resource limit set before exec (soft and hard alike).
type Rlimit struct {
	Resource int    `json:"resource"`
	Limit    uint64 `json:"limit"`
}

// joinCgroups moves the init (all its threads) into each cgroup whose
// cgroup.procs file is listed, before anything of the call is built: from
// here on, its memory, tasks and tmpfs pages count against the call's
// limits. Writing 0 means the writer itself, whatever its PID namespace.
func joinCgroups(procs []string) error {
	for _, p := range procs {
		if err := os.WriteFile(p, []byte("0\n"), 0); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	return nil
}

// lockDown is the last step before exec, on the thread that execs: resource
// limits, then the capability sets cut to keep (bounding, ambient,
// inheritable, permitted, effective), then no_new_privs, then the seccomp
// filter. Order matters: dropping from the bounding set needs CAP_SETPCAP,
// which the capset may remove; loading a filter without CAP_SYS_ADMIN
// needs no_new_privs.
func (s *Spec) lockDown() error {
	for _, r := range s.Rlimits {
		// syscall.Setrlimit, not unix's: for RLIMIT_NOFILE it also tells
		// the Go runtime not to restore the limit it found at start-up
		// when it execs.
		lim := syscall.Rlimit{Cur: r.Limit, Max: r.Limit}
		if err := syscall.Setrlimit(r.Resource, &lim); err != nil {
			return fmt.Errorf("set rlimit %d to %d: %w", r.Resource, r.Limit, err)
		}
	}
	if s.Caps != nil {
		if err := dropCaps(*s.Caps); err != nil {
			return err
		}
	}
	if s.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}
	if len(s.Seccomp) > 0 {
		if err := loadSeccomp(s.Seccomp); err != nil {
			return err
		}
	}
	return nil
}

// dropCaps leaves the thread with exactly keep (a bit per capability
// number) in its bounding, permitted and effective sets and nothing
// inheritable or ambient. As root, exec gives the new program its bounding
// set, so the bounding set is what decides; the others are cut so that
// /proc/PID/status tells the truth.
func dropCaps(keep uint64) error {
	for c := 0; c < 64; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL { // past the kernel's last capability
			break
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		half := uint32(keep >> (32 * i))
		data[i].Effective, data[i].Permitted = half, half
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

// loadSeccomp installs a classic BPF program given as 8-byte sock_filter
// entries in native (little-endian: the sandbox builds filters only for
// little-endian architectures) byte order.
func loadSeccomp(raw []byte) error {
	if len(raw)%8 != 0 || len(raw)/8 > 4096 {
		return fmt.Errorf("seccomp filter: %d bytes is not a program", len(raw))
	}
	prog := make([]unix.SockFilter, len(raw)/8)
	for i := range prog {
		b := raw[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.LittleEndian.Uint32(b[4:])}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("load seccomp filter: %w", err)
	}
	return nil
}
