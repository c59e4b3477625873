package sandbox

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
	"github.com/skeinnet/skein/internal/netns"
)

// Sandbox runs executables from image rootfs directories, each call in a
// sandbox of its own (see the package comment). It is safe for concurrent
// use; it does not limit concurrency itself (Runner does).
type Sandbox struct {
	opts     Options
	pool     *pool
	prepared *prepared
	// cgroups makes each call's cgroups; nil when calls run without
	// (Options.Cgroups).
	cgroups *cgroupSet
	// seccomp is the filter every call loads (confine_linux.go); nil on
	// an architecture without one.
	seccomp []byte
	caps    uint64 // Options.Capabilities as a mask
	// canNice: this process may lower a nice value (CAP_SYS_NICE in the
	// initial user namespace), so inits started ahead wait at aheadNice
	// and get their nice value back when claimed.
	canNice bool
	// ownProc: /proc is of this process's PID namespace (/proc/self is
	// this process), so a PID's threads may be looked up there.
	ownProc bool
	// initExe is what starts an init: Options.InitPath, or the binary
	// that was there when New ran, held open as initFile (see pinInit).
	initExe  string
	initFile *os.File
	// execFile is Options.ExecPath held open and handed to prepared
	// inits (sandboxinit.ExecFD); nil: they exec calls themselves, as
	// they do once execOff is set (an init could not exec it).
	execFile *os.File
	execOff  atomic.Bool
	// removing counts the background work of ended calls under way:
	// cgroup removals (dropCgroup), mount namespaces let go (release).
	removing background
	state    stateMounts
}

// New returns a Sandbox, creating the scratch directory and starting the
// warm inits (Options.Prestart). Close stops those.
func New(o Options) (*Sandbox, error) {
	o = o.withDefaults()
	if err := absClean("scratch directory", o.ScratchDir); err != nil {
		return nil, err
	}
	if o.NodeNetNS != "" {
		if err := absClean("node netns", o.NodeNetNS); err != nil {
			return nil, err
		}
		if err := netns.IsNetNS(o.NodeNetNS); err != nil {
			return nil, fmt.Errorf("sandbox node netns: %w", err)
		}
	}
	if err := os.MkdirAll(o.ScratchDir, 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox scratch directory: %w", err)
	}
	s := &Sandbox{opts: o}
	if err := s.pinInit(); err != nil {
		return nil, err
	}
	s.openHelper()
	if err := s.confine(); err != nil {
		s.closeHelper()
		return nil, err
	}
	s.canNice = canLowerNice()
	self, err := os.Readlink("/proc/self")
	s.ownProc = err == nil && self == strconv.Itoa(os.Getpid())
	s.pool = newPool(s, o.Prestart)
	s.pool.refill()
	s.prepared = newPrepared(s, o.Prestart)
	return s, nil
}

// mustStat is f's FileInfo, nil when it cannot be had (os.SameFile
// reports false then).
func mustStat(f *os.File) os.FileInfo {
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	return st
}

// pinFloor is the lowest number the pinned descriptor may take (a
// variable for the tests).
var pinFloor = 64

// pinInit opens the init binary once: every init of this Sandbox runs the
// binary that was at InitPath when it was made, through the descriptor
// (see below), whatever replaces the file later. The init speaks
// the protocol of the skeind it came with (sandboxinit); an upgrade in
// place that replaced both files while skeind runs would otherwise start
// new inits that the running skeind does not understand. The re-executed
// running binary (/proc/self/exe) is pinned already. The descriptor lives
// as long as the Sandbox (calls may start cold after Close).
//
// The child execs it as /proc/<skeind's PID>/fd/N, not /proc/self/fd/N:
// between fork and exec the Go runtime moves descriptors in the child's
// own table (its status pipe goes to the number above the highest one the
// child is handed), so the child's N may be a pipe by then; skeind's table
// is not touched. The lookup is skeind's own process under the same
// credentials, which procfs allows while skeind is dumpable (a process
// that changed credentials or has file capabilities is not; inits then
// start from the path). The PID is the one /proc knows skeind by.
func (s *Sandbox) pinInit() error {
	s.initExe = s.opts.InitPath
	if s.opts.InitPath == "/proc/self/exe" {
		return nil
	}
	f, err := os.Open(s.opts.InitPath)
	if err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, pinFloor)
	if err != nil {
		return fmt.Errorf("sandbox init %s: %w", s.opts.InitPath, err)
	}
	s.initFile = os.NewFile(uintptr(fd), s.opts.InitPath)
	self, err := os.Readlink("/proc/self")
	if err == nil {
		s.initExe = "/proc/" + self + "/fd/" + strconv.Itoa(fd)
	}
	dumpable, derr := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	st, serr := os.Stat(s.initExe)
	if err != nil || derr != nil || dumpable != 1 || serr != nil || !os.SameFile(st, mustStat(f)) {
		s.opts.Logger.Warn("sandbox: an init cannot reach the pinned init binary through /proc (no /proc of this process, or it is not dumpable); inits start from the path, and an upgrade in place may start a newer one", "path", s.opts.InitPath)
		s.initExe = s.opts.InitPath
	}
	return nil
}

// confine prepares what every call is confined by: its cgroups (or the
// warning that there will be none) and the seccomp filter.
func (s *Sandbox) confine() error {
	s.caps = capMask(s.opts.Capabilities)
	var err error
	if s.seccomp, err = seccompFilter(); err != nil {
		s.opts.Logger.Warn("sandbox: plugins run without a seccomp filter", "err", err)
	}
	if s.opts.Cgroups == CgroupOff {
		return nil
	}
	s.cgroups, err = newCgroupSet(s.opts)
	switch {
	case err == nil:
	case s.opts.Cgroups == CgroupRequire:
		return fmt.Errorf("sandbox cgroups: %w", err)
	default:
		s.opts.Logger.Warn("sandbox: plugin calls run without cgroups of their own: no pids or memory limit per call, their processes and memory count against the daemon's (set the sandbox's cgroup mode to require them, or off to silence this)", "err", err)
	}
	return nil
}

// newCgroup makes a call's cgroups, or returns nil when calls run without.
func (s *Sandbox) newCgroup(path string) (*callCgroup, error) {
	if s.cgroups == nil {
		return nil, nil
	}
	cg, err := s.cgroups.create()
	if err != nil {
		return nil, &Error{Path: path, Err: fmt.Errorf("%w: %w", ErrSetup, err), ExitCode: -1}
	}
	return cg, nil
}

// Close stops the inits kept warm and removes the default cgroup parent if
// it is empty by then (a Sandbox still using it, in this process or another
// one, removes it when it closes). Calls running go on; later calls start
// cold (and make the parent again). Safe to call more than once.
func (s *Sandbox) Close() error {
	s.prepared.close()
	s.pool.close()
	s.removing.Wait()
	s.cgroups.close()
	s.closeHelper()
	return nil
}

// openHelper opens Options.ExecPath as execFile when it is a program the
// prepared inits can exec inside any image: static (no ELF interpreter,
// which the kernel would load from the image: the tenant's code, before
// the call) and for this machine. Anything else is logged, and prepared
// inits exec calls themselves.
func (s *Sandbox) openHelper() {
	p := s.opts.ExecPath
	if p == "" || p == "-" {
		return
	}
	f, err := os.Open(p)
	if err == nil {
		err = staticFor(f, runtime.GOARCH)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		s.opts.Logger.Warn("sandbox: not using the exec helper; prepared inits exec calls themselves (slower with many calls at once)", "path", p, "err", err)
		return
	}
	s.execFile = f
}

func (s *Sandbox) closeHelper() {
	if s.execFile != nil {
		s.execFile.Close()
	}
}

// helperFailed is prepare's report of an init that could not exec the
// helper (sandboxinit.ExecFailed): from now on prepared inits exec calls
// themselves, said once.
func (s *Sandbox) helperFailed(why string) {
	if !s.execOff.Swap(true) {
		s.opts.Logger.Warn("sandbox: a prepared init could not exec the exec helper; prepared inits exec calls themselves from now on", "path", s.opts.ExecPath, "err", why)
	}
}

// elfMachines are the ELF machines of the architectures skein builds for.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "riscv64": elf.EM_RISCV,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "386": elf.EM_386, "arm": elf.EM_ARM,
}

// staticFor checks that f is an executable ELF program for goarch without
// an interpreter (static, or static-pie).
func staticFor(f *os.File, goarch string) error {
	e, err := elf.NewFile(f)
	if err != nil {
		return fmt.Errorf("not an ELF program: %w", err)
	}
	defer e.Close()
	if want, ok := elfMachines[goarch]; !ok || e.Machine != want {
		return fmt.Errorf("built for %v, not for %s", e.Machine, goarch)
	}
	if e.Type != elf.ET_EXEC && e.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %v is not a program", e.Type)
	}
	for _, prog := range e.Progs {
		if prog.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it has an ELF interpreter, which would be loaded from the plugin's image): build it static")
		}
	}
	return nil
}

// background runs functions in goroutines of their own and waits for
// them. Unlike a sync.WaitGroup it may start more while a Wait is under
// way (calls still running when Close waits end and start theirs).
type background struct {
	mu   sync.Mutex
	n    int
	zero sync.Cond
}

// Go runs f in a goroutine of its own.
func (b *background) Go(f func()) {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
	go func() {
		defer func() {
			b.mu.Lock()
			if b.n--; b.n == 0 && b.zero.L != nil {
				b.zero.Broadcast()
			}
			b.mu.Unlock()
		}()
		f()
	}()
}

// Wait returns when no function started by Go is running.
func (b *background) Wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.zero.L == nil {
		b.zero.L = &b.mu
	}
	for b.n > 0 {
		b.zero.Wait()
	}
}

// Result is what a successful call produced.
type Result struct {
	Stdout   []byte // at most Options.StdoutLimit bytes
	Stderr   []byte // the last Options.StderrLimit bytes (logs)
	Duration time.Duration
}

// Run runs spec to completion: the executable's stdout on exit status 0,
// otherwise an *Error wrapping ErrExit, ErrTimeout, ErrOutputTooLarge,
// ErrSetup or the context's error; an error of Spec.Wait is returned as it
// is. Bad specs fail before anything runs.
// Whatever way the call ends, nothing it started is left running and no
// mount of it remains.
func (s *Sandbox) Run(ctx context.Context, spec Spec) (*Result, error) {
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = s.opts.Timeout
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx, stop := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer stop()

	begin := time.Now()
	stdout := &limitWriter{limit: s.opts.StdoutLimit, over: func() { cancel(ErrOutputTooLarge) }}
	stderr := &tailWriter{limit: s.opts.StderrLimit}
	fail := func(err error) *Error {
		return &Error{Path: spec.Path, Err: err, ExitCode: -1, Stderr: stderr.bytes()}
	}

	is, err := s.initSpec(spec)
	if err != nil {
		return nil, err
	}
	// An init prepared for the call's layout if one is ready (see
	// prepared), else a warm init (see pool), else a cold start. Whichever
	// way, the call's cgroups (the init's, or made for a cold start) are
	// killed and removed once it is over (deferred after the refills, so
	// that runs first).
	key, layout, call, ok := layoutOf(is)
	var (
		wait  func() error
		cg    *callCgroup
		mntns *os.File // the init's mount namespace, held (warmInit.mntns)
		ran   bool
	)
	if ok {
		defer func() { s.prepared.done(key, ran) }()
	}
	defer s.pool.refill()
	defer func() {
		s.dropCgroup(cg)
		s.release(mntns)
	}()
	if ok {
		if w := s.prepared.take(key, layout); w != nil {
			cg, mntns = w.cg, w.mntns
			if wait, err = w.claim(ctx, call, spec.Stdin, stdout, stderr, spec.Wait); !errors.Is(err, errStale) {
				s.pool.prep.Add(1)
			}
		}
	}
	if wait == nil && (err == nil || errors.Is(err, errStale)) {
		if w := s.pool.take(); w != nil {
			s.dropCgroup(cg)
			s.release(mntns)
			cg, mntns = w.cg, w.mntns
			if wait, err = w.claim(ctx, is, spec.Stdin, stdout, stderr, spec.Wait); !errors.Is(err, errStale) {
				s.pool.warm.Add(1)
			}
		}
	}
	if wait == nil && (err == nil || errors.Is(err, errStale)) {
		s.dropCgroup(cg)
		s.release(mntns)
		mntns = nil
		if cg, err = s.newCgroup(spec.Path); err != nil {
			return nil, err
		}
		is.Cgroups = cg.procs()
		s.pool.cold.Add(1)
		if spec.Wait != nil {
			err = spec.Wait(ctx) // handled below, as a warm call's refusal is
		}
		if err == nil {
			var cmd *exec.Cmd
			if cmd, err = s.startCold(ctx, is, bytes.NewReader(spec.Stdin), stdout, stderr, stopHow{}); err == nil {
				wait = cmd.Wait
			}
		}
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Stderr = stderr.bytes()
			if ctx.Err() != nil {
				e.Err = s.contextErr(ctx, timeout)
			}
			return nil, e
		}
		if ctx.Err() != nil {
			// The timeout or a cancel while Spec.Wait held the call.
			return nil, fail(s.contextErr(ctx, timeout))
		}
		return nil, err
	}
	werr := wait()
	ran = true
	res := &Result{Stdout: stdout.buf.Bytes(), Stderr: stderr.bytes(), Duration: time.Since(begin)}
	switch {
	case stdout.hit:
		return nil, fail(fmt.Errorf("%w of %d bytes", ErrOutputTooLarge, s.opts.StdoutLimit))
	case werr == nil:
		return res, nil
	case ctx.Err() != nil:
		return nil, fail(s.contextErr(ctx, timeout))
	}
	e := fail(fmt.Errorf("%w: %w", ErrExit, werr))
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal().String()
		} else {
			e.ExitCode = ee.ExitCode()
		}
	} else {
		// Not an exit status: an I/O error around the process.
		e.Err = fmt.Errorf("wait: %w", werr)
	}
	e.CNI = parseCNIError(res.Stdout)
	return nil, e
}

func (s *Sandbox) contextErr(ctx context.Context, timeout time.Duration) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrTimeout) {
		return fmt.Errorf("%w after %s (process tree killed)", ErrTimeout, timeout)
	}
	if errors.Is(cause, ErrOutputTooLarge) {
		return fmt.Errorf("%w of %d bytes", ErrOutputTooLarge, s.opts.StdoutLimit)
	}
	return fmt.Errorf("canceled (process tree killed): %w", cause)
}

// stopHow says how cancelling a started tree ends it: with signal (default
// SIGKILL), then SIGKILL after grace (default 2 s; it also bounds waiting
// for the output pipes after the init exited).
type stopHow struct {
	signal syscall.Signal
	grace  time.Duration
}

// start checks spec and starts it cold (see startCold) in cgroups of its
// own; the caller calls done once it has waited for cmd.
func (s *Sandbox) start(ctx context.Context, spec Spec, stdout, stderr io.Writer, stop stopHow) (cmd *exec.Cmd, done func(), err error) {
	is, err := s.initSpec(spec)
	if err != nil {
		return nil, nil, err
	}
	cg, err := s.newCgroup(spec.Path)
	if err != nil {
		return nil, nil, err
	}
	is.Cgroups = cg.procs()
	if cmd, err = s.startCold(ctx, is, bytes.NewReader(spec.Stdin), stdout, stderr, stop); err != nil {
		s.dropCgroup(cg)
		return nil, nil, err
	}
	return cmd, func() { s.dropCgroup(cg) }, nil
}

// release closes a held mount namespace in the background: the last
// reference unmounts the call's tree (see warmInit.mntns).
func (s *Sandbox) release(mntns *os.File) {
	if mntns != nil {
		s.removing.Go(func() { mntns.Close() })
	}
}

// dropCgroup kills what is left in a call's cgroups and removes them, in
// the background: the caller need not wait (Close does). Nothing of a call
// that ended normally is left to kill: its executable was PID 1 of its
// PID namespace, and the kernel kills and reaps the namespace's other
// processes before that one's exit is reported. The kill is for what the
// cgroup holds beyond that (an init killed before it exec'd, a kernel
// surprise).
func (s *Sandbox) dropCgroup(cg *callCgroup) {
	if cg == nil || cg.dropped.Swap(true) {
		return
	}
	s.removing.Go(func() {
		if err := cg.kill(); err != nil {
			s.opts.Logger.Error("sandbox: processes left in a call's cgroup", "err", err)
		}
		if err := cg.remove(); err != nil {
			s.opts.Logger.Error("sandbox: call cgroup left behind", "err", err)
		}
	})
}

// startCold starts an init for is and returns once the executable runs
// (the init exec'd it) or setup failed (an *Error wrapping ErrSetup; the
// child has been waited for). Cancelling ctx stops the tree as stop says.
func (s *Sandbox) startCold(ctx context.Context, is *sandboxinit.Spec, stdin io.Reader, stdout, stderr io.Writer, stop stopHow) (*exec.Cmd, error) {
	raw, err := json.Marshal(is)
	if err != nil {
		return nil, fmt.Errorf("encode sandbox spec: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox status pipe: %w", err)
	}
	defer errR.Close()

	cmd := s.initCommand(ctx, sandboxinit.SpecEnv+"="+string(raw))
	cmd.Stdin = stdin
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.ExtraFiles = []*os.File{errW}
	// Everything the tree holds dies with the init, so the pipes close
	// promptly; the default delay only bounds a kernel surprise.
	cmd.WaitDelay = 2 * time.Second
	if stop.grace > 0 {
		cmd.WaitDelay = stop.grace
	}
	if stop.signal != 0 {
		cmd.Cancel = func() error {
			// The executable is PID 1 of its namespace: a signal it has
			// no handler for is dropped, and waiting out the grace for
			// it would only stall the caller. Kill it at once then.
			if !catches(cmd.Process.Pid, stop.signal) {
				return cmd.Process.Kill()
			}
			return cmd.Process.Signal(stop.signal)
		}
	}
	err = startLocked(cmd)
	errW.Close()
	if err != nil {
		return nil, &Error{Path: is.Path, Err: fmt.Errorf("%w: start sandbox init %s: %w", ErrSetup, s.opts.InitPath, err), ExitCode: -1}
	}
	if err := awaitExec(errR, ctx); err != nil {
		cmd.Wait()
		return nil, &Error{Path: is.Path, Err: err, ExitCode: -1}
	}
	return cmd, nil
}

// initCommand is the init's command line, environment and namespaces.
func (s *Sandbox) initCommand(ctx context.Context, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.initExe)
	cmd.Args = []string{sandboxinit.Arg0}
	// The init's own environment (the plugin gets Spec.Env): one P is
	// plenty for a few syscalls and starts measurably faster (~0.3 ms).
	cmd.Env = append(env, "GOMAXPROCS=1")
	cmd.Dir = "/"
	// The init is PID 1 of the new PID namespace: SIGKILL to it (timeout,
	// cancel) takes the whole tree with it. It leads a session of its own,
	// as runc's inits do: without a controlling terminal, a plugin could
	// open skeind's through /dev/tty (skeind started from a shell) and,
	// with CAP_SYS_ADMIN, push input into it (TIOCSTI).
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
		Setsid:     true,
	}
	return cmd
}

// startLocked starts cmd from a thread held for the occasion: Pdeathsig
// fires when the forking thread exits, not the process, and the Go runtime
// ends a thread only when a goroutine locked to it exits.
func startLocked(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cmd.Start()
}

// startNiced is startLocked with the forking thread at nice for the fork,
// so that every thread of the child is born at it (a thread the child
// made before a renice from outside would miss it). It returns the
// thread's nice value before, which the child had none of. Only where
// lowering a nice value works (canNice): the thread gets its own back
// before it goes back to the runtime's pool (if that failed, a thread of
// this process would go on at nice: logged).
func startNiced(cmd *exec.Cmd, nice int, log *slog.Logger) (base int, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0) // this thread; 20 - nice
	if err != nil {
		return 0, cmd.Start()
	}
	base = 20 - prio
	if base >= nice || unix.Setpriority(unix.PRIO_PROCESS, 0, nice) != nil {
		return base, cmd.Start()
	}
	err = cmd.Start()
	if rerr := unix.Setpriority(unix.PRIO_PROCESS, 0, base); rerr != nil {
		log.Error("sandbox: a thread of this process stays at the nice value of inits started ahead", "nice", nice, "err", rerr)
	}
	return base, err
}

// awaitExec reads the init's status pipe to its end: nothing means the
// executable was exec'd; a message is why setup failed.
func awaitExec(status io.Reader, ctx context.Context) error {
	msg, _ := io.ReadAll(status)
	if len(msg) == 0 && ctx.Err() == nil {
		return nil
	}
	if len(msg) == 0 {
		msg = []byte("interrupted")
	}
	return fmt.Errorf("%w: %s", ErrSetup, wordErrno(string(msg)))
}

// wordErrno words the "errno N" that ends a message of skein-sandbox-exec
// (which has no table of its own) as the Go init words the same failure.
func wordErrno(msg string) string {
	i := strings.LastIndex(msg, "errno ")
	if i < 0 {
		return msg
	}
	n, err := strconv.Atoi(msg[i+len("errno "):])
	if err != nil || n <= 0 || n > 4095 {
		return msg
	}
	return msg[:i] + syscall.Errno(n).Error()
}

// initSpec checks spec against the filesystem and turns it into the
// child's instructions.
func (s *Sandbox) initSpec(spec Spec) (*sandboxinit.Spec, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("sandbox spec: %w", err)
	}
	if err := isDir(spec.Rootfs); err != nil {
		return nil, fmt.Errorf("sandbox spec: rootfs: %w", err)
	}
	is := &sandboxinit.Spec{
		Scratch: s.opts.ScratchDir,
		Rootfs:  spec.Rootfs,
		Path:    spec.Path,
		Args:    spec.Args,
		Env:     env(spec.Env),
		TmpSize: s.opts.TmpSize,
		// The node's namespace stays pinned by its path for the
		// sandbox's life; a missing one fails the call's setup.
		NodeNetNS: s.opts.NodeNetNS,
		// The confinement (confine_linux.go).
		Rlimits:    s.opts.rlimits(),
		Caps:       &s.caps,
		NoNewPrivs: true,
		Seccomp:    s.seccomp,
	}
	if spec.NetNS != "" {
		if err := netns.IsNetNS(spec.NetNS); err != nil {
			return nil, fmt.Errorf("sandbox spec: %w", err)
		}
		is.NetNSDirs = append(is.NetNSDirs, filepath.Dir(spec.NetNS))
	}
	for _, d := range spec.NetNSDirs {
		if err := isDir(d); err != nil {
			return nil, fmt.Errorf("sandbox spec: netns directory: %w", err)
		}
		if len(is.NetNSDirs) == 0 || is.NetNSDirs[0] != d {
			is.NetNSDirs = append(is.NetNSDirs, d)
		}
	}
	if spec.StateDir != "" {
		if err := isDir(spec.StateDir); err != nil {
			return nil, fmt.Errorf("sandbox spec: state directory: %w", err)
		}
		if err := s.prepareState(spec.StateDir); err != nil {
			return nil, fmt.Errorf("sandbox spec: %w", err)
		}
		is.StateDir = spec.StateDir
		is.StateMount = spec.StateMount
		if is.StateMount == "" {
			is.StateMount = DefaultStateMount
		}
	}
	if isDir(s.opts.ModulesDir) == nil {
		is.ModulesDir = s.opts.ModulesDir
	}
	for _, p := range append([]string{is.Rootfs, spec.NetNS, is.StateDir, is.ModulesDir}, is.NetNSDirs...) {
		if p == "" {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return nil, fmt.Errorf("sandbox spec: %w", err)
		}
		is.Expect = append(is.Expect, sandboxinit.FileID{Path: p, Dev: st.Dev, Ino: st.Ino})
	}
	return is, nil
}

// defaultInitPath is the dedicated init binary beside the running one, if
// it is there, else the running binary.
func defaultInitPath() string {
	if p := besideSelf(DefaultInitName); p != "" {
		return p
	}
	return "/proc/self/exe"
}

// besideSelf is the executable file name in the running binary's
// directory, or "" when there is none.
func besideSelf(name string) string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

func isDir(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s: not a directory", p)
	}
	return nil
}

// catches reports whether process pid has a handler for sig (the SigCgt
// mask of /proc/PID/status); true when that cannot be read, so the caller
// falls back to signalling and the grace.
func catches(pid int, sig syscall.Signal) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		hex, ok := strings.CutPrefix(line, "SigCgt:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return true
		}
		return mask&(1<<(uint(sig)-1)) != 0
	}
	return true
}
