package sandboxinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The protocol between a sandbox and its init: argv[0] is Arg0; the layout
// is Spec as JSON, either in the environment variable SpecEnv (a cold
// start) or, when WarmEnv is set instead, read from file descriptor SpecFD
// (a warm start: the init was started ahead of need and waits there, the
// namespaces already made); file descriptor ErrFD is the write end of a
// pipe that stays silent and closes on a successful exec, or carries the
// reason setup failed. A warm init whose SpecFD closes empty exits
// quietly.
//
// On SpecFD the spec is one JSON document, then GoMsg, then the pipe's end.
// The init does all it can with the document (a warm init builds the whole
// sandbox and applies the confinement) and execs only once GoMsg and the
// end have followed, so the sandbox can hand a call over before the caller
// lets it run (sandbox.Spec.Wait). The end alone is no go: the sandbox's
// death closes the pipe too, and an init that was never told to go fails
// without exec'ing. Anything else after the document is refused; a sandbox
// that calls a start off kills the init.
//
// A prepared start has both: SpecEnv holds a Spec without the executable
// (Path, Args, Env), and PreparedEnv is set. The init builds the whole
// sandbox from it (mounts, pivot_root) and applies the confinement, writes
// ReadyMsg to ReadyFD and closes it, then waits on SpecFD for a Spec
// carrying only Path, Args, Env and Expect (checked inside the new root)
// and the go, and execs. The call pays for none of the mounts.
const (
	Arg0        = "skein-sandbox-init"
	SpecEnv     = "SKEIN_SANDBOX_SPEC"
	WarmEnv     = "SKEIN_SANDBOX_WARM"
	PreparedEnv = "SKEIN_SANDBOX_PREPARED"
	ErrFD       = 3
	SpecFD      = 4
	ReadyFD     = 5
	ReadyMsg    = "ready"
	GoMsg       = "\ngo\n"
	// ExecEnv set on a prepared start: file descriptor ExecFD is
	// skein-sandbox-exec (cmd/skein-sandbox-exec), which the init execs
	// once it is built and confined, with ErrFD, SpecFD and ReadyFD left
	// open. That program reports ready, reads the call (sandbox's
	// encodeCall, not JSON), and execs it: the call's exec is then one
	// from a single-threaded process, which waits for no thread to exit.
	ExecEnv = "SKEIN_SANDBOX_EXEC"
	ExecFD  = 6
	// ExecFailed starts the setup error of an init that could not exec
	// skein-sandbox-exec: the sandbox stops handing it over.
	ExecFailed = "exec the sandbox's exec helper: "
)

// Spec is what the init needs to build the sandbox and exec. Paths are
// absolute and checked by the sandbox before it starts the init.
type Spec struct {
	Scratch    string   `json:"scratch"`              // empty host directory for the scaffolding
	Rootfs     string   `json:"rootfs"`               // the image, read-only
	Path       string   `json:"path"`                 // executable inside the image
	Args       []string `json:"args"`                 // argv[1:]
	Env        []string `json:"env"`                  // the whole environment
	NetNSDirs  []string `json:"netnsDirs,omitempty"`  // bound at their own paths
	StateDir   string   `json:"stateDir,omitempty"`   // bound writable at StateMount
	StateMount string   `json:"stateMount,omitempty"` // where StateDir appears
	ModulesDir string   `json:"modulesDir,omitempty"` // bound read-only at /lib/modules
	TmpSize    int64    `json:"tmpSize"`              // bytes, for /tmp and /run
	NodeNetNS  string   `json:"nodeNetNS,omitempty"`  // network namespace to enter first ("" = the one inherited)

	// Confinement (see confine_linux.go). Cgroups are cgroup.procs files
	// joined first; the rest is applied just before exec.
	Cgroups    []string `json:"cgroups,omitempty"`
	Rlimits    []Rlimit `json:"rlimits,omitempty"`
	Caps       *uint64  `json:"caps,omitempty"` // capabilities kept (bit per number); nil: all
	NoNewPrivs bool     `json:"noNewPrivs,omitempty"`
	Seccomp    []byte   `json:"seccomp,omitempty"` // sock_filter entries, 8 bytes each
	// Expect are host paths as the sandbox saw them. A warm init copied
	// the host's mounts when it started; a mount made since in a directory
	// without shared propagation (a netns pinned there, say) did not reach
	// it, and the path would name the file underneath. The init checks
	// each and fails with StaleView, and the sandbox starts cold instead.
	Expect []FileID `json:"expect,omitempty"`
}

// FileID names a file by device and inode.
type FileID struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
}

// StaleView starts the setup error of an init whose view of the host
// differs from the sandbox's (see Spec.Expect).
const StaleView = "stale view of the host: "

func init() { MaybeRun() }

// MaybeRun turns the process into a sandbox's init when it was started as
// one, and never returns in that case; in every other process it returns at
// once. The package's init function calls it, so a binary that imports the
// package (directly or through package sandbox) cannot forget it.
func MaybeRun() {
	if len(os.Args) == 0 || os.Args[0] != Arg0 {
		return
	}
	// Everything from here to the exec on the main thread (a package
	// init runs there already): the sandbox renices that thread, by
	// the process's ID, for the call.
	runtime.LockOSThread()
	raw, cold := os.LookupEnv(SpecEnv)
	if os.Getenv(PreparedEnv) != "" {
		runPrepared(raw)
	}
	if !cold && os.Getenv(WarmEnv) == "" {
		return
	}
	err := enslave()
	var s Spec
	var spec *specReader
	switch {
	case err != nil:
	case cold:
		err = s.decode(raw)
	default:
		if spec, err = readSpec(&s); err == nil {
			err = s.checkView()
		}
	}
	if err == nil {
		err = s.build()
	}
	if err == nil {
		err = s.lockDown()
	}
	if err == nil && spec != nil {
		err = spec.awaitGo()
	}
	if err == nil {
		err = s.execLocked()
	}
	// Only failures get here: a successful start ends in exec.
	reportSetup(err)
	os.Exit(127)
}

// enslave is step 1: nothing done from here on may reach the host. Every
// copied mount becomes a slave: the host's changes still arrive (a netns
// pin removed on the host must not stay alive here, however long a warm
// init waits), ours never leave.
func enslave() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves: %w", err)
	}
	return nil
}

// decode reads a spec and checks the paths it expects (checkView).
func (s *Spec) decode(raw string) error {
	if err := json.Unmarshal([]byte(raw), s); err != nil {
		return err
	}
	return s.checkView()
}

// checkView compares the paths the sandbox checked with what this process
// sees.
func (s *Spec) checkView() error {
	for _, f := range s.Expect {
		var st unix.Stat_t
		if err := unix.Stat(f.Path, &st); err != nil {
			return fmt.Errorf("%s%s: %w", StaleView, f.Path, err)
		}
		if st.Dev != f.Dev || st.Ino != f.Ino {
			return fmt.Errorf("%s%s is another file here", StaleView, f.Path)
		}
	}
	return nil
}

// specReader is SpecFD once the spec has been read from it.
type specReader struct {
	f   *os.File
	dec *json.Decoder
}

// readSpec decodes the spec of a warm or prepared start from SpecFD into
// s without waiting for the pipe's end; nothing at all means the sandbox
// no longer needs this init, which exits.
func readSpec(s *Spec) (*specReader, error) {
	f := os.NewFile(SpecFD, "sandbox-spec")
	dec := json.NewDecoder(f)
	if err := dec.Decode(s); err != nil {
		f.Close()
		if errors.Is(err, io.EOF) {
			os.Exit(0)
		}
		return nil, fmt.Errorf("read spec: %w", err)
	}
	return &specReader{f: f, dec: dec}, nil
}

// awaitGo waits for the sandbox's go, GoMsg and the end of SpecFD (see the
// protocol above). The end without GoMsg, or anything else, is no go.
func (r *specReader) awaitGo() error {
	defer r.f.Close()
	rest, err := io.ReadAll(io.LimitReader(io.MultiReader(r.dec.Buffered(), r.f), 64))
	switch {
	case err != nil:
		return fmt.Errorf("read spec: %w", err)
	case len(rest) == 0:
		return errors.New("the sandbox closed the call without a go")
	case string(rest) != GoMsg:
		return fmt.Errorf("read spec: %q after the spec, want the go", rest)
	}
	return nil
}

func reportSetup(err error) {
	if err == nil {
		err = errors.New("exec returned without an error")
	}
	f := os.NewFile(ErrFD, "sandbox-errors")
	fmt.Fprint(f, err.Error())
	f.Close()
}

// runPrepared is a prepared start (see PreparedEnv): the sandbox built from
// layout, then the executable named by the spec that arrives on SpecFD. It
// never returns.
func runPrepared(layout string) {
	err := enslave()
	var s Spec
	if err == nil {
		err = s.decode(layout)
	}
	if err == nil {
		err = s.build()
	}
	if err == nil {
		// The confinement too: nothing left to do needs more than
		// reading the call, a few stats and exec.
		err = s.lockDown()
	}
	if err == nil && os.Getenv(ExecEnv) != "" {
		err = execHelper()
	}
	if err == nil {
		// Ready: from here on only the call's own part is missing.
		ready := os.NewFile(ReadyFD, "sandbox-ready")
		_, err = ready.WriteString(ReadyMsg)
		ready.Close()
	}
	var call Spec
	var spec *specReader
	if err == nil {
		spec, err = readSpec(&call)
	}
	if err == nil {
		// Inside the new root now: the paths checked are the netns
		// directories and pins, bound at their own paths.
		err = call.checkView()
	}
	if err == nil {
		err = spec.awaitGo()
	}
	if err == nil {
		err = call.execLocked()
	}
	reportSetup(err)
	os.Exit(127)
}

// execHelper execs skein-sandbox-exec from ExecFD (see ExecEnv), with
// the protocol's descriptors open and every other one closing. It returns
// only when the exec failed.
func execHelper() error {
	for _, fd := range []int{ErrFD, SpecFD, ReadyFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("keep descriptor %d for the exec helper: %w", fd, err)
		}
	}
	if err := closeOnExec(ReadyFD + 1); err != nil {
		return err
	}
	argv, err := syscall.SlicePtrFromStrings([]string{"skein-sandbox-exec"})
	if err != nil {
		return err
	}
	empty, _ := unix.BytePtrFromString("")
	envv := []*byte{nil}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, ExecFD, uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envv[0])), unix.AT_EMPTY_PATH, 0)
	runtime.KeepAlive(argv)
	runtime.KeepAlive(empty)
	runtime.KeepAlive(envv)
	unix.CloseOnExec(ErrFD)
	return fmt.Errorf("%s%w", ExecFailed, errno)
}

// build makes the sandbox's filesystem and enters it: cgroups, the node's
// network namespace, the mounts, pivot_root. The process is already alone
// in new mount and PID namespaces (its parent cloned it so), its mounts
// slaves of the host's (step 1, in MaybeRun); mount(2) and pivot_root(2)
// act on the namespace and the shared fs state, so the Go runtime's other
// threads are no concern. It leaves the thread locked for exec.
func (s *Spec) build() error {
	unix.CloseOnExec(ErrFD)
	unix.Umask(0)
	// Namespaces, capabilities, no_new_privs and seccomp filters belong to
	// a thread: this one stays locked until exec, and the program exec'd
	// keeps what it set.
	runtime.LockOSThread()

	// Step 1a: the call's cgroups, before anything of it is allocated.
	if err := joinCgroups(s.Cgroups); err != nil {
		return err
	}

	// Step 1b: the node's network namespace, when the daemon runs outside
	// it. Entered before /sys is mounted, so the sysfs shows the node's
	// devices.
	if s.NodeNetNS != "" {
		fd, err := unix.Open(s.NodeNetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open node netns %s: %w", s.NodeNetNS, err)
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("enter node netns %s: %w", s.NodeNetNS, err)
		}
	}

	// Step 2: scaffolding on the scratch directory: a tiny tmpfs holding an
	// overlay over the image. The overlay's only writes are the mount points
	// created below, so the shared image cache is never touched.
	if err := unix.Mount("skein-sandbox", s.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("mount scratch tmpfs on %s: %w", s.Scratch, err)
	}
	root := s.Scratch + "/root"
	for _, d := range []string{"upper", "work", "root"} {
		if err := unix.Mkdir(s.Scratch+"/"+d, 0o755); err != nil {
			return fmt.Errorf("scratch: %w", err)
		}
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", s.Rootfs, s.Scratch, s.Scratch)
	if err := unix.Mount("skein-sandbox", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, ovl); err != nil {
		return fmt.Errorf("mount image rootfs %s: %w", s.Rootfs, err)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open new root: %w", err)
	}
	defer unix.Close(rootFD)

	// Step 3: the mounts, parents before children (a netns directory under
	// /run or /tmp lands on the tmpfs), each target resolved inside the new
	// root.
	for _, m := range s.mounts() {
		if err := m.apply(rootFD); err != nil {
			return err
		}
	}

	// Step 3b: /proc's dangerous corners masked or read-only, as runc does.
	if err := protectProc(rootFD); err != nil {
		return err
	}

	// Step 4: the image read-only, then pivot_root into it and detach the
	// old root: the host's tree is gone from this namespace.
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make rootfs read-only: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("enter new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

// execLocked is step 5, on the thread build locked, once lockDown (limits,
// capabilities, no_new_privs, seccomp) is done: exec. The executable
// becomes PID 1 of its namespace.
func (s *Spec) execLocked() error {
	unix.Umask(0o022)
	if err := closeOnExec(3); err != nil {
		return err
	}
	argv := append([]string{s.Path}, s.Args...)
	if err := unix.Exec(s.Path, argv, s.Env); err != nil {
		return fmt.Errorf("exec %s: %w", s.Path, err)
	}
	return nil
}

// closeOnExec marks every descriptor from first on close-on-exec (from 3
// for the executable, so that it starts with 0, 1 and 2 only): the init's
// own protocol pipes are marked already, but whatever the daemon itself
// inherited without the flag (from a launcher that leaks descriptors: a
// script, a supervisor, socket activation) came through its fork and this
// init's, and would reach the plugin otherwise.
func closeOnExec(first int) error {
	err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Before Linux 5.11: one by one, from the list of open descriptors.
	d, oerr := os.Open("/proc/self/fd")
	if oerr != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w (and list them: %w)", err, oerr)
	}
	names, rerr := d.Readdirnames(-1)
	d.Close()
	if rerr != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w (and list them: %w)", err, rerr)
	}
	for _, n := range names {
		fd, aerr := strconv.Atoi(n)
		if aerr != nil || fd < first {
			continue
		}
		// The listing's own descriptor is closed by now: EBADF.
		if _, ferr := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); ferr != nil && ferr != unix.EBADF {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, ferr)
		}
	}
	return nil
}

// mount is one entry of the sandbox's filesystem.
type mount struct {
	target string
	// fstype mounts a new file system; empty means bind source.
	fstype, source, data string
	flags                uintptr
	// rebind remounts a bind with flags (read-only, nosuid...).
	rebind bool
	rec    bool
	// after runs once the mount is in place, with its directory open.
	after func(dirFD int) error
}

func (s *Spec) mounts() []mount {
	const nsd = unix.MS_NOSUID | unix.MS_NODEV
	tmp := fmt.Sprintf("size=%d,nr_inodes=65536", s.TmpSize)
	ms := []mount{
		{target: "/proc", fstype: "proc", source: "proc", flags: nsd | unix.MS_NOEXEC},
		{target: "/sys", fstype: "sysfs", source: "sysfs", flags: nsd | unix.MS_NOEXEC | unix.MS_RDONLY},
		{target: "/dev", fstype: "tmpfs", source: "skein-sandbox", flags: unix.MS_NOSUID | unix.MS_NOEXEC,
			data: "mode=0755,size=64k,nr_inodes=64", after: populateDev},
		{target: "/tmp", fstype: "tmpfs", source: "skein-sandbox", flags: nsd, data: "mode=1777," + tmp},
		{target: "/run", fstype: "tmpfs", source: "skein-sandbox", flags: nsd, data: "mode=0755," + tmp},
	}
	if s.ModulesDir != "" {
		ms = append(ms, mount{target: "/lib/modules", source: s.ModulesDir, rec: true, rebind: true,
			flags: nsd | unix.MS_NOEXEC | unix.MS_RDONLY})
	}
	for _, d := range s.NetNSDirs {
		// Recursive: the pins are mounts inside the directory. They stay
		// slaves of the host's (step 1), so new pins appear and removed
		// ones go. Read-only: a plugin opens namespaces, it does not pin
		// or remove them.
		ms = append(ms, mount{target: d, source: d, rec: true, rebind: true,
			flags: nsd | unix.MS_NOEXEC | unix.MS_RDONLY})
	}
	if s.StateDir != "" {
		ms = append(ms, mount{target: s.StateMount, source: s.StateDir, rebind: true, flags: nsd})
	}
	return ms
}

func (m mount) apply(rootFD int) error {
	fd, err := mkdirIn(rootFD, m.target, 0)
	if err != nil {
		return fmt.Errorf("mount point %s: %w", m.target, err)
	}
	at := fmt.Sprintf("/proc/self/fd/%d", fd)
	if m.fstype != "" {
		err = unix.Mount(m.source, at, m.fstype, m.flags, m.data)
	} else {
		flags := uintptr(unix.MS_BIND)
		if m.rec {
			flags |= unix.MS_REC
		}
		err = unix.Mount(m.source, at, "", flags, "")
	}
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.describe(), m.target, err)
	}
	if !m.rebind && m.after == nil {
		return nil
	}
	// The descriptor names the directory under the new mount; look the
	// target up again to reach the mount itself.
	fd, err = mkdirIn(rootFD, m.target, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", m.target, err)
	}
	defer unix.Close(fd)
	if m.rebind {
		at = fmt.Sprintf("/proc/self/fd/%d", fd)
		if err := unix.Mount("", at, "", unix.MS_REMOUNT|unix.MS_BIND|m.flags, ""); err != nil {
			return fmt.Errorf("remount %s: %w", m.target, err)
		}
	}
	if m.after != nil {
		return m.after(fd)
	}
	return nil
}

func (m mount) describe() string {
	if m.fstype != "" {
		return m.fstype
	}
	return "bind of " + m.source
}

// populateDev fills the sandbox's /dev: the usual character devices (made
// here rather than bound from the host: cheaper, and nothing else of the
// host's /dev shows) and the links programs expect.
func populateDev(dirFD int) error {
	// The fd is O_PATH; mknodat and symlinkat need a real directory fd.
	fd, err := unix.Openat(dirFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev: %w", err)
	}
	defer unix.Close(fd)
	devs := []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}
	for _, d := range devs {
		if err := unix.Mknodat(fd, d.name, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", d.name, err)
		}
	}
	links := [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}}
	for _, l := range links {
		if err := unix.Symlinkat(l[0], fd, l[1]); err != nil {
			return fmt.Errorf("symlink /dev/%s: %w", l[1], err)
		}
	}
	return nil
}

// mkdirIn opens the directory p inside the tree rooted at rootFD, creating
// the missing parts (mode 0755). Every lookup is confined to the root
// (RESOLVE_IN_ROOT: ".." and absolute symlinks stop at it) and refuses magic
// links, so an image's symlinks can redirect a mount point only within the
// image. A dangling symlink on the way is followed by creating its target.
// The result is an O_PATH descriptor.
func mkdirIn(rootFD int, p string, depth int) (int, error) {
	if depth > 16 {
		return -1, fmt.Errorf("%s: too many levels of symbolic links", p)
	}
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	cur := "/"
	for _, name := range strings.Split(strings.Trim(p, "/"), "/") {
		if name == "" {
			continue
		}
		next := path.Join(cur, name)
		fd, err := unix.Openat2(rootFD, next, how)
		if err == nil {
			unix.Close(fd)
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("open %s: %w", next, err)
		}
		parent, err := unix.Openat2(rootFD, cur, how)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", cur, err)
		}
		err = unix.Mkdirat(parent, name, 0o755)
		if errors.Is(err, unix.EEXIST) {
			// A dangling symlink: create what it points at.
			var target string
			target, err = readlinkat(parent, name)
			if err == nil {
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				var tfd int
				if tfd, err = mkdirIn(rootFD, path.Clean(target), depth+1); err == nil {
					unix.Close(tfd)
				}
			}
		}
		unix.Close(parent)
		if err != nil {
			return -1, fmt.Errorf("create %s: %w", next, err)
		}
		cur = next
	}
	fd, err := unix.Openat2(rootFD, cur, how)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", cur, err)
	}
	return fd, nil
}

func readlinkat(dirFD int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirFD, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
