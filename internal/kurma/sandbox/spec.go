package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"
)

// Defaults for the zero values of Options and Spec.
const (
	DefaultTimeout     = 60 * time.Second
	DefaultStdoutLimit = 1 << 20
	DefaultStderrLimit = 64 << 10
	DefaultScratchDir  = "/run/skein/sandbox"
	DefaultStateMount  = "/var/lib/network"
	DefaultModulesDir  = "/lib/modules"
	DefaultTmpSize     = 64 << 20
	DefaultPrestart    = 2
	// DefaultPidsLimit caps the tasks (processes and threads) of one call
	// or main exec: a Go plugin runs a dozen threads, iptables and the
	// like a few processes.
	DefaultPidsLimit = 128
	// DefaultMemoryLimit caps the memory of one call or main exec,
	// its /tmp and /run included. A reference CNI plugin peaks near 30
	// MiB.
	DefaultMemoryLimit = 256 << 20
	// DefaultNoFileLimit is the open-file limit (RLIMIT_NOFILE) inside.
	DefaultNoFileLimit = 4096
	// DefaultStateSize and DefaultStateInodes bound a network's state
	// directory (host-local keeps a small file per address).
	DefaultStateSize   = 16 << 20
	DefaultStateInodes = 16384
	// DefaultCgroupName is the cgroup, under the daemon's own in each
	// hierarchy, holding one cgroup per call.
	DefaultCgroupName = "skein-sandbox"
	// DefaultInitName is the dedicated init binary (cmd/skein-sandbox-init)
	// looked for beside the running binary.
	DefaultInitName = "skein-sandbox-init"
	// DefaultExecName is the small program a prepared init execs the
	// call through (cmd/skein-sandbox-exec), looked for beside the
	// running binary.
	DefaultExecName = "skein-sandbox-exec"
)

// BaseEnv is the environment every sandboxed executable starts with; Spec.Env
// adds to it (a later KEY= wins).
var BaseEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/",
}

// Options configure a Sandbox. Every zero value means the documented default.
type Options struct {
	// ScratchDir is an empty host directory each call mounts its private
	// scaffolding on, inside its own mount namespace (so concurrent calls
	// share it without conflict and the host never sees those mounts).
	// Created if missing. Default DefaultScratchDir.
	ScratchDir string
	// InitPath is the binary started to enter the namespaces; it must run
	// package sandboxinit's hook (every binary importing this package
	// does). Default: DefaultInitName beside the running binary when it is
	// there (a small binary that starts in about a third of the time
	// skeind takes), else /proc/self/exe (the running binary itself).
	InitPath string
	// ExecPath is skein-sandbox-exec, the program a prepared init
	// becomes once it is built and confined, to wait for its call and
	// exec it from a single thread (sandboxinit.ExecEnv). Default:
	// DefaultExecName beside the running binary when it is there; "-" or
	// no such file: prepared inits exec calls themselves.
	ExecPath string
	// Timeout bounds a call that sets none. Default DefaultTimeout (the
	// contract's one minute).
	Timeout time.Duration
	// StdoutLimit caps a call's stdout; beyond it the call is killed and
	// fails with ErrOutputTooLarge. Default DefaultStdoutLimit.
	StdoutLimit int
	// StderrLimit is how much of a call's stderr is kept (the last bytes).
	// Default DefaultStderrLimit.
	StderrLimit int
	// ModulesDir is the host directory bound read-only at /lib/modules;
	// skipped when it does not exist. Default DefaultModulesDir.
	ModulesDir string
	// TmpSize caps the call's /tmp and /run tmpfs, in bytes. Default
	// DefaultTmpSize.
	TmpSize int64
	// Prestart is how many inits Run keeps started ahead of need, waiting
	// in their new namespaces (a warm start takes the init's start-up and
	// the namespace creation off the call's path). Default
	// DefaultPrestart; negative: none, every call starts cold.
	Prestart int
	// NodeNetNS is the path of the node's network namespace, which every
	// call (and main exec) enters before its executable starts, when the
	// daemon itself runs outside it (skeind --node-netns; tests). Empty:
	// calls share the network namespace of the process that starts them.
	NodeNetNS string

	// Cgroups says whether each call and main exec runs in cgroups of its
	// own (pids and memory; see CgroupMode). Default CgroupAuto.
	Cgroups CgroupMode
	// CgroupParent is where the per-call cgroups are made, a path inside
	// each hierarchy (e.g. /skein). Default: DefaultCgroupName under the
	// daemon's own cgroup of that hierarchy, so the limits of the
	// container skeind runs in (if any) still hold over its plugins.
	CgroupParent string
	// PidsLimit caps one call's tasks (pids.max). Default
	// DefaultPidsLimit.
	PidsLimit int64
	// MemoryLimit caps one call's memory in bytes, tmpfs pages included
	// (memory.limit_in_bytes, memory.max on cgroup v2); over it the
	// kernel's OOM killer picks within the call. Default
	// DefaultMemoryLimit.
	MemoryLimit int64
	// StateSize caps a network's state directory in bytes: the sandbox
	// mounts a tmpfs that size over it (see state_linux.go for what that
	// keeps across restarts and reboots). Default DefaultStateSize;
	// negative: the directory is bound as it is, without a limit.
	StateSize int64
	// StateInodes caps the files in a state directory. Default
	// DefaultStateInodes.
	StateInodes int64
	// Capabilities are the capability numbers (unix.CAP_*) a call keeps.
	// Default PluginCapabilities; set it only for a plugin that needs
	// more, knowing what the capability opens.
	Capabilities []int
	// NoFileLimit is RLIMIT_NOFILE inside (soft and hard). Default
	// DefaultNoFileLimit.
	NoFileLimit int
	// Logger gets the sandbox's warnings (cgroups unavailable, no seccomp
	// filter on this architecture). Default slog.Default().
	Logger *slog.Logger
}

// CgroupMode says what happens when per-call cgroups cannot be made.
type CgroupMode int

const (
	// CgroupAuto uses cgroups when the pids and memory controllers can be
	// written; when they cannot (a read-only /sys/fs/cgroup in a pod, a
	// controller missing), New logs a warning saying so and calls run
	// without them (still under the daemon's own cgroup).
	CgroupAuto CgroupMode = iota
	// CgroupRequire makes New fail instead.
	CgroupRequire
	// CgroupOff never makes cgroups: calls count against the daemon's.
	CgroupOff
)

func (o Options) withDefaults() Options {
	if o.ScratchDir == "" {
		o.ScratchDir = DefaultScratchDir
	}
	if o.InitPath == "" {
		o.InitPath = defaultInitPath()
	}
	if o.ExecPath == "" {
		o.ExecPath = besideSelf(DefaultExecName)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.StdoutLimit <= 0 {
		o.StdoutLimit = DefaultStdoutLimit
	}
	if o.StderrLimit <= 0 {
		o.StderrLimit = DefaultStderrLimit
	}
	if o.ModulesDir == "" {
		o.ModulesDir = DefaultModulesDir
	}
	if o.TmpSize <= 0 {
		o.TmpSize = DefaultTmpSize
	}
	if o.Prestart == 0 {
		o.Prestart = DefaultPrestart
	}
	o.Prestart = max(o.Prestart, 0)
	if o.PidsLimit <= 0 {
		o.PidsLimit = DefaultPidsLimit
	}
	if o.MemoryLimit <= 0 {
		o.MemoryLimit = DefaultMemoryLimit
	}
	if o.NoFileLimit <= 0 {
		o.NoFileLimit = DefaultNoFileLimit
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StateSize == 0 {
		o.StateSize = DefaultStateSize
	}
	if o.StateInodes <= 0 {
		o.StateInodes = DefaultStateInodes
	}
	if o.Capabilities == nil {
		o.Capabilities = PluginCapabilities
	}
	return o
}

// Spec is one executable to run in a sandbox.
type Spec struct {
	// Rootfs is the unpacked image: an absolute path to a directory. It is
	// only read.
	Rootfs string
	// Path is the executable inside the rootfs (absolute), e.g.
	// /opt/network/add.
	Path string
	// Args are the arguments after argv[0], passed as given.
	Args []string
	// Stdin is written to the executable's stdin, then closed.
	Stdin []byte
	// Env is added to BaseEnv: KEY=VALUE entries.
	Env []string
	// NetNS, when set, is the pod's network namespace path (a pinned
	// namespace, not under /proc). Its directory is bound at the same path.
	// It is not added to Args: the caller places it.
	NetNS string
	// NetNSDirs are more directories of pinned namespaces to bind at their
	// own paths (a main exec serving every pod, say).
	NetNSDirs []string
	// StateDir, when set, is the network's host state directory, bound
	// writable at StateMount.
	StateDir string
	// StateMount is where StateDir appears. Default DefaultStateMount.
	StateMount string
	// Timeout bounds the call (Run only). Default Options.Timeout.
	Timeout time.Duration
	// Wait, when set, is the caller's go (Run only): the sandbox does what
	// it can before the executable starts (a warm or prepared init gets
	// the call and checks it; a warm one builds the filesystem), then
	// calls Wait, and starts the executable only if it returns nil. An
	// error ends the call with that error before anything of it ran: no
	// process of the call ever ran the executable. It may be called more
	// than once (a stale init is replaced) and must then return the same.
	// The time it takes counts against Timeout.
	Wait func(ctx context.Context) error `json:"-"`
}

// Op names an executable of the Kurma contract.
type Op string

// The executables a network plugin image provides.
const (
	OpAdd Op = "add"
	OpDel Op = "del"
)

// Plugin is what a network contributes to each of its calls.
type Plugin struct {
	Rootfs   string
	Config   []byte // the network's config entry, given on stdin
	StateDir string
	Env      []string
	Timeout  time.Duration
}

// Call returns the Spec for /opt/network/<op> as the Kurma contract calls
// it: argv is (netns path, container UUID, interface), the interface an
// empty string when the network renders none, so positions never shift.
func (p Plugin) Call(op Op, netns, containerID, ifname string) Spec {
	return Spec{
		Rootfs:   p.Rootfs,
		Path:     "/opt/network/" + string(op),
		Args:     []string{netns, containerID, ifname},
		Stdin:    p.Config,
		Env:      p.Env,
		NetNS:    netns,
		StateDir: p.StateDir,
		Timeout:  p.Timeout,
	}
}

// validate checks the parts of a spec that need no filesystem.
func (s *Spec) validate() error {
	if err := absClean("rootfs", s.Rootfs); err != nil {
		return err
	}
	// The overlay mount takes the rootfs in its option string, where these
	// separate entries.
	if strings.ContainsAny(s.Rootfs, ",:\\") {
		return fmt.Errorf("rootfs %q: must not contain ',', ':' or '\\'", s.Rootfs)
	}
	if err := absClean("executable path", s.Path); err != nil {
		return err
	}
	if s.Path == "/" {
		return fmt.Errorf("executable path %q: not a file", s.Path)
	}
	for _, a := range s.Args {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("argument %q: contains a NUL byte", a)
		}
	}
	for _, e := range s.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return fmt.Errorf("environment entry %q: want KEY=VALUE", e)
		}
	}
	if s.NetNS != "" {
		if err := absClean("netns path", s.NetNS); err != nil {
			return err
		}
		if underProc(s.NetNS) {
			return fmt.Errorf("netns path %q: paths under /proc are not usable inside the sandbox (its /proc is its own); pin the namespace to a file and pass that", s.NetNS)
		}
		// The pin's directory is bound into the sandbox at its own path:
		// for a pin in / that would be the host's root over the image's.
		if filepath.Dir(s.NetNS) == "/" {
			return fmt.Errorf("netns path %q: a namespace pinned in / cannot be shown to a plugin; pin it in a directory (e.g. /run/netns)", s.NetNS)
		}
	}
	for _, d := range s.NetNSDirs {
		if err := absClean("netns directory", d); err != nil {
			return err
		}
		if d == "/" || underProc(d) {
			return fmt.Errorf("netns directory %q: not allowed", d)
		}
	}
	if s.StateDir != "" {
		if err := absClean("state directory", s.StateDir); err != nil {
			return err
		}
	}
	if s.StateMount != "" {
		if err := absClean("state mount", s.StateMount); err != nil {
			return err
		}
		if s.StateMount == "/" {
			return fmt.Errorf("state mount %q: not allowed", s.StateMount)
		}
	}
	return nil
}

func absClean(what, p string) error {
	if p == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%s %q: want an absolute, clean path", what, p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%s %q: contains a NUL byte", what, p)
	}
	return nil
}

func underProc(p string) bool {
	return p == "/proc" || strings.HasPrefix(p, "/proc/")
}

// env is BaseEnv with extra appended, later keys replacing earlier ones.
func env(extra []string) []string {
	out := make([]string, 0, len(BaseEnv)+len(extra))
	idx := map[string]int{}
	for _, e := range append(append([]string{}, BaseEnv...), extra...) {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := idx[k]; ok {
			out[i] = e
			continue
		}
		idx[k] = len(out)
		out = append(out, e)
	}
	return out
}
