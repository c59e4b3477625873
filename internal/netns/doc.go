// Package netns is the only place in skein that enters network namespaces.
//
// It owns three things: running a function inside a namespace (Do), opening
// netlink handles whose sockets live in a namespace (Handle), and the
// namespace-relative files under /proc/sys (WriteSysctl). It also pins new
// namespaces to a path (Create/Remove) for tests and tools, preparing the
// pin directory as iproute2 does (PrepareDir, which explains why), and reads
// the mount table those pins live in (MountTable).
//
// # The thread hazard
//
// setns(2) changes the namespace of one OS thread, not of the process, while
// the Go scheduler moves goroutines between threads freely. Code that enters a
// namespace must therefore lock its goroutine to its thread, and if switching
// back fails the thread must never run other goroutines again. Do delegates
// to github.com/containernetworking/plugins/pkg/ns, which runs fn on a fresh
// goroutine locked to its thread and leaves the thread locked (so the runtime
// destroys it) when it cannot restore the original namespace. Consequences for
// callers:
//
//   - fn runs on another goroutine: it must not rely on goroutine-local state
//     (e.g. call t.FailNow) and must not start goroutines expecting them to
//     inherit the namespace — they will not.
//   - sockets keep the namespace they were created in, so the cheap pattern is
//     "create the socket inside Do, use it anywhere" (see Handle).
//   - processes started by fn (os/exec) inherit the namespace of the thread
//     that forks them, which is fn's thread.
package netns
