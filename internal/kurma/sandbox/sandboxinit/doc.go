// Package sandboxinit is the first process of a plugin sandbox (see package
// sandbox): started by the sandbox in fresh mount and PID namespaces, it
// builds the sandbox's filesystem, pivots into it and execs the plugin.
//
// It is its own small package so that a dedicated binary
// (cmd/skein-sandbox-init) can hold it and little else: a sandbox call pays
// for starting the init process, and a small Go binary starts in a fraction
// of the time a daemon's does (see the sandbox benchmarks).
package sandboxinit
