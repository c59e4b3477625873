package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// hostile runs one of the probes a hostile plugin image would try and
// prints what happened as JSON. The probes are benign: they open for
// writing without writing, list what they reach, and stop at what they
// were told.
func hostile(c config) {
	r := map[string]any{}
	errs := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	switch c.Probe {
	case "core_pattern":
		// Opening for writing is the whole test: nothing is written.
		f, err := os.OpenFile("/proc/sys/kernel/core_pattern", os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		r["corePattern"] = errs(err)
		// Other host-wide knobs and information.
		for name, p := range map[string]string{"sysVM": "/proc/sys/vm/drop_caches", "sysrq": "/proc/sysrq-trigger"} {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				f.Close()
			}
			r[name] = errs(err)
		}
		// The node's network sysctls stay writable (plugins set them).
		f, err = os.OpenFile("/proc/sys/net/ipv4/conf/all/forwarding", os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		r["netSysctl"] = errs(err)
		for name, p := range map[string]string{"kcore": "/proc/kcore", "keys": "/proc/keys", "timerList": "/proc/timer_list"} {
			b, err := os.ReadFile(p)
			r[name] = fmt.Sprintf("%d bytes %s", len(b), errs(err))
		}
		ents, err := os.ReadDir("/proc/acpi")
		r["acpi"] = fmt.Sprintf("%d entries %s", len(ents), errs(err))
	case "shocker":
		shocker(r, errs)
	case "tty":
		// The controlling terminal, if the call has one: its number in
		// /proc/self/stat, and whether /dev/tty opens. Nothing is typed.
		stat, _ := os.ReadFile("/proc/self/stat")
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
			if f := strings.Fields(string(stat)[i+1:]); len(f) > 4 {
				r["ttyNr"] = f[4]
			}
		}
		fd, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY, 0)
		if err == nil {
			unix.Close(fd)
		}
		r["devTty"] = errs(err)
	case "forkbomb":
		started := 0
		var firstErr error
		for i := 0; i < c.N; i++ {
			cmd := exec.Command("/proc/self/exe", "grandchild", c.Token)
			if err := cmd.Start(); err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			started++
		}
		r["started"], r["err"] = started, errs(firstErr)
		// Exits at once: the PID namespace's end and the cgroup take the
		// children.
	case "memory":
		var keep [][]byte
		for i := 0; i < c.MB; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		r["allocatedMB"] = len(keep)
	case "fillstate":
		buf := make([]byte, 1<<20)
		written, files := 0, 0
		var werr error
		for written < c.MB<<20 && werr == nil {
			// Many files as well as bytes: inodes are a resource too.
			p := filepath.Join(state, fmt.Sprintf("fill%s-%d", c.Token, files))
			werr = os.WriteFile(p, buf, 0o644)
			if werr == nil {
				written += len(buf)
				files++
			}
		}
		r["writtenMB"], r["err"] = written>>20, errs(werr)
	case "privs":
		status, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(status), "\n") {
			for _, k := range []string{"NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
				if v, ok := strings.CutPrefix(l, k+":"); ok {
					r[k] = strings.TrimSpace(v)
				}
			}
		}
		cg, _ := os.ReadFile("/proc/self/cgroup")
		r["cgroup"] = string(cg)
		if fd, err := unix.Open("/opt/network/add", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			r["finitModule"] = errs(unix.FinitModule(fd, "", 0))
			unix.Close(fd)
		}
		r["initModule"] = errs(unix.InitModule([]byte("\x7fELF not a module"), ""))
		r["deleteModule"] = errs(unix.DeleteModule("skein_probe_no_such_module", 0))
		os.MkdirAll("/tmp/m", 0o755)
		r["mount"] = errs(unix.Mount("probe", "/tmp/m", "tmpfs", 0, ""))
		r["umountProc"] = errs(unix.Unmount("/proc/keys", unix.MNT_DETACH))
		// The UTS namespace is the host's: set the name it already has, so
		// that even where this succeeds nothing changes.
		var uts unix.Utsname
		unix.Uname(&uts)
		r["sethostname"] = errs(unix.Sethostname([]byte(unix.ByteSliceToString(uts.Nodename[:]))))
		r["unshareUser"] = errs(unix.Unshare(unix.CLONE_NEWUSER))
		r["mknod"] = errs(unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
		// A program exec'd from here, setuid-root bits or file
		// capabilities and all, gets no more than this process has.
		out, err := exec.Command("/proc/self/exe", "capeff").Output()
		r["childCapEff"], r["childErr"] = strings.TrimSpace(string(out)), errs(err)
	default:
		fail("unknown probe %q", c.Probe)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// capEff prints the process's effective capability set.
func capEff() {
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			fmt.Println(strings.TrimSpace(v))
		}
	}
}

// shocker is the 2014 "shocker" escape: name_to_handle_at on a file of a
// host file system the sandbox shows (the state directory) gives the handle
// format; a made-up handle with inode 2 (an ext4 root) opened with
// open_by_handle_at would be that file system's root directory.
func shocker(r map[string]any, errs func(error) string) {
	dir, err := os.Open(state)
	if err != nil {
		r["err"] = errs(err)
		return
	}
	defer dir.Close()
	htype := int32(1) // FILEID_INO32_GEN: u32 inode, u32 generation
	if h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, state, 0); err == nil {
		htype = h.Type()
		r["handleType"], r["handleBytes"] = h.Type(), len(h.Bytes())
	} else {
		r["nameToHandle"] = errs(err)
	}
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, 2)
	fd, err := unix.OpenByHandleAt(int(dir.Fd()), unix.NewFileHandle(htype, b), unix.O_RDONLY|unix.O_DIRECTORY)
	r["openByHandle"] = errs(err)
	if err == nil {
		f := os.NewFile(uintptr(fd), "host-root")
		names, _ := f.Readdirnames(20)
		f.Close()
		r["reached"] = names
	}
}
