// Package e2e holds skein's privileged end-to-end tests of the CNI front
// door. Each test starts a real skeind for a throwaway "node" network
// namespace, creates "pod" namespaces, and drives the real skein binary the
// way a container runtime does — through libcni — or, where libcni cannot
// say it (missing environment variables, garbage on stdin, names libcni
// refuses itself), by executing the binary directly.
//
// The tests need root and skip otherwise; they never touch the namespace
// they run in. What every test checks besides its own case: what the spec
// (or skein's documented error codes) expects, and that nothing is left
// behind in the node namespace or in skeind's records.
package e2e
