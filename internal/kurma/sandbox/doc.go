// Package sandbox runs a network plugin's executables from an unpacked image
// rootfs, the way the Kurma network contract calls them (/opt/network/add and
// /opt/network/del with the config on stdin and the pod's netns path,
// container UUID and interface name as arguments; the image's main exec for
// the network's lifetime), with the containment Kurma left out.
//
// It owns three things: one sandboxed call (Sandbox.Run), the ordering and
// concurrency of calls (Runner: parallel across pods, in order within one,
// under a global cap) and the supervision of a main exec (Supervisor: restart
// with backoff, a clear "down" error for callers, the tree killed on Close).
//
// # What a call sees
//
// Each call gets its own mount and PID namespaces and shares the host's
// network, IPC and UTS namespaces (a plugin must configure the host side of
// its links). Its filesystem, built before the executable starts:
//
//	/              the image rootfs, read-only (an overlay over it whose only
//	               writes are the mount points below, so the image cache is
//	               never modified, then remounted read-only)
//	/proc          a fresh procfs of the call's PID namespace; as runc has
//	               it, /proc/sys, /proc/bus, /proc/fs, /proc/irq and
//	               /proc/sysrq-trigger read-only (but /proc/sys/net
//	               writable: plugins set forwarding and link sysctls) and
//	               /proc/kcore, /proc/keys, /proc/timer_list, /proc/acpi,
//	               /proc/scsi... masked (/dev/null or an empty read-only
//	               tmpfs over them)
//	/sys           a fresh sysfs, read-only, /sys/firmware masked
//	/dev           a small tmpfs: null, zero, full, random, urandom, tty and
//	               the fd/stdin/stdout/stderr links
//	/tmp, /run     tmpfs, writable, gone with the call
//	/lib/modules   the host's, read-only, when the host has it
//	<netns dir>    the directory holding the pod's netns path, at the same
//	               path, so the argument works as given; read-only
//	/var/lib/network  the network's state directory (host directory given
//	               by the caller), writable and kept between calls: a tmpfs
//	               of Options.StateSize bytes mounted over the host
//	               directory on first use (see state_linux.go for what
//	               survives a restart and a reboot)
//
// The old root is detached after pivot_root, so nothing else of the host's
// filesystem is reachable. Mount targets are resolved inside the new root
// (openat2 RESOLVE_IN_ROOT), so a symlink in an image cannot aim a mount at
// the host. Mount propagation: every host mount the call sees is a slave (a
// host-side change, such as a pod's netns pin being removed, reaches the
// call; nothing flows back) and every mount the call makes is private, so
// nothing a sandbox does appears in the host's mount table. (Fully private
// copies would be simpler, but a long-running main exec would then keep
// every pod namespace pinned in its directory alive after the host removed
// it.)
//
// A netns path under /proc (/proc/<pid>/ns/net, as Kurma's document shows)
// is refused: the call's /proc belongs to its own PID namespace, where that
// path means nothing, and such a path would change meaning when the process
// exits anyway. Callers pin the namespace first (bind-mount it to a file)
// and pass the pin.
//
// # Confinement
//
// A plugin is code from an image, and the sandbox is meant to hold one that
// is hostile: what it may do is what a network plugin needs, and no more.
// Each call (and each run of a main exec):
//
//   - runs in a pids and a memory cgroup of its own (Options.PidsLimit,
//     MemoryLimit), under DefaultCgroupName in the daemon's own cgroup, so
//     that a container's limits on skeind still hold over its plugins. A
//     fork bomb stops at the limit, an allocation past it is OOM-killed
//     inside the call, and when the call ends whatever is left in the
//     cgroups is killed and the cgroups removed. Where the cgroup file
//     system cannot be written (a read-only /sys/fs/cgroup in a pod), New
//     logs a warning and calls run without, or fails (Options.Cgroups);
//   - keeps only PluginCapabilities (CAP_NET_ADMIN, CAP_SYS_ADMIN,
//     CAP_NET_RAW, CAP_NET_BIND_SERVICE) in its bounding, permitted and
//     effective sets, runs with no_new_privs (no setuid or file capability
//     gives more), RLIMIT_CORE 0 and RLIMIT_NOFILE Options.NoFileLimit;
//   - runs under a seccomp filter that refuses mounting and unmounting,
//     setns into anything but a network namespace, new user namespaces,
//     module loading, kexec, reboot, bpf, perf, keyrings, clock and host
//     name changes, open_by_handle_at and the like with EPERM, and kills a
//     process making another architecture's system calls (see
//     deniedSyscalls);
//   - sees /proc and /sys with the host's knobs read-only or masked, and a
//     state directory that cannot grow past Options.StateSize;
//   - leads a session of its own, with no controlling terminal (not the
//     one of a daemon started from a shell).
//
// What it does not guarantee. A plugin is root with CAP_NET_ADMIN and
// CAP_SYS_ADMIN in the node's network namespace, as the contract requires:
// it can rewrite the node's links, routes, firewall and network sysctls,
// watch and inject its traffic, and enter any network namespace pinned in
// a directory bound into it (every pod's, for a pin directory like
// /run/netns). It shares the host's IPC namespace (root's System V IPC
// objects) and UTS namespace (read-only to it). The seccomp filter is a
// deny list: the rest of the kernel's interface, and its bugs, stay
// reachable by a root process. The filter exists for amd64 and arm64 only
// (elsewhere New logs that calls run without one), and without writable
// cgroups (above) there are no per-call pids or memory limits. Cgroup v2
// support (pids.max, memory.max) was written for hosts where pids and
// memory are on the unified hierarchy but not tested on one; it needs the
// daemon's cgroup to be able to delegate controllers, which cgroup v2
// refuses while the daemon's cgroup holds processes, unless CgroupParent
// names a delegated place.
//
// # Processes
//
// The executable is the init (PID 1) of its PID namespace. When it exits,
// or is killed at its timeout, the kernel kills everything it started, so a
// forked helper never outlives its call (and the call's cgroups are swept
// for anything that escaped the tree). As an init it ignores signals it has
// no handler for, except SIGKILL from outside, which is what the timeout and
// Supervisor.Close use (Close sends SIGTERM first, with a grace period,
// only to a main exec that handles it: /proc/PID/status SigCgt). The whole tree
// also gets SIGKILL if the process that started it (skeind) dies.
//
// Descriptors: the executable starts with 0, 1 and 2 only; the init marks
// every other one close-on-exec just before it execs, including any the
// daemon inherited without the flag from whatever started it.
//
// Environment: PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
// and HOME=/, plus what the caller adds (Spec.Env); nothing of the daemon's
// environment leaks in. Stdout is the result, capped (Options.StdoutLimit;
// over it the call is killed and fails with ErrOutputTooLarge); stderr is
// kept apart, its last Options.StderrLimit bytes returned for errors and
// logs. A non-zero exit is an *Error carrying the exit status, stderr and the
// CNI error object the plugin printed on stdout, if any.
//
// # Getting into the namespaces
//
// A multi-threaded Go process must not unshare its mount namespace, so a
// call starts a fresh process with CLONE_NEWNS and CLONE_NEWPID: the init
// (package sandboxinit), which builds the filesystem and execs the plugin.
// The init is the dedicated binary skein-sandbox-init when it is installed
// beside the running binary (it starts fastest), else the running binary
// re-executed (/proc/self/exe). A re-executed binary recognises itself in
// package sandboxinit's init function, before main, so a binary that imports
// this package cannot forget the hook and start a second daemon instead;
// MaybeRunInit is the same hook for a main or TestMain that wants to say so.
//
// Starting the init and creating its namespaces is most of a call's
// overhead, so a Sandbox keeps a few inits started ahead of need
// (Options.Prestart): each waits in its new namespaces for a spec on a
// pipe, and a call that claims one pays only for the mounts. Its copy of
// the host's mounts dates from its start, so the call's host paths are
// checked by device and inode first; a mismatch (a netns pinned since in a
// directory that does not propagate mounts) makes the call start cold.
// Close stops them. The Supervisor's main execs always start cold.
//
// An init started ahead (warm or prepared, below) starts, builds and waits
// at nice 19, and its main thread — the one that execs the call — gets
// back the nice value it started with (a cold call's) when a call claims
// it, before it reads the spec. A burst of calls refills the inits it took
// while its later calls still run; at the daemon's priority the refills
// took the CPU from them. Lowering a nice value takes CAP_SYS_NICE in the
// initial user namespace, which New tries; without it (in a user
// namespace, say) inits start at the daemon's priority.
//
// A warm init is also moved into its call's cgroups while it waits. That
// matters on cgroup v1: every move into a cgroup waits for an RCU grace
// period (the kernel's cgroup_threadgroup_rwsem), several milliseconds on
// a busy machine, which a cold start pays on the call's path (mounting the
// hierarchies with favordynmods, Linux 6.1+, makes moves cheap).
//
// The mounts are the rest of a warm call's overhead, and they depend only
// on the call's layout (image, netns directories, state directory), the
// same for every call of a network. Once a layout has been called, the
// Sandbox keeps inits prepared for it (Options.Prestart of them per
// layout, for the 8 layouts used last, each dropped after two minutes
// unused): each has built the whole filesystem, pivoted into it and
// applied the confinement, and waits for the executable, its arguments
// and environment. A call of that layout takes one and pays for the exec
// alone. What a prepared init was built on is checked when it is claimed
// (a re-unpacked image or a re-mounted state directory is another layout;
// a netns pin is checked inside its new root, as for warm inits), and
// ReleaseState drops the inits that have the directory bound. The call's
// mount namespace is held until it is over and torn down in the
// background, so the unmounts (which wait for an RCU grace period) are not
// on the exit the caller waits for. See prepared_linux.go.
//
// A prepared init does not exec the call itself when skein-sandbox-exec
// (cmd/skein-sandbox-exec, C, Options.ExecPath) is installed beside the
// daemon: once built and confined, the Go init execs that small program
// through a descriptor the Sandbox holds, and it is what waits for the
// call and execs it. exec waits for every other thread of the process to
// exit, and a Go process has four or five; with calls at once on busy
// cores each waits for a CPU. The helper is one thread, so the call's exec
// waits for nothing, and the Go init's own exec happens while it is
// prepared, off the call's path. It changes nothing else: the capability
// sets, no_new_privs, the seccomp filter, the limits and the cgroups carry
// over the second exec as over the first, errors read the same
// (wordErrno), and without the helper the Go init execs calls as before.
// The helper runs inside the image's root, so it must be static: New
// uses it only if it is an ELF program for this machine without an
// interpreter (which the kernel would load from the tenant's image), and
// the first init that cannot exec it turns it off for the Sandbox. Either
// is logged.
package sandbox
