// Command skein-sandbox-init is the first process of each network-plugin
// sandbox skeind starts (package internal/kurma/sandbox): it builds the
// sandbox's filesystem, pivots into it and execs the plugin. skeind uses it
// when it is installed beside skeind, because it starts several times faster
// than re-executing skeind itself; it is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
)

func main() {
	sandboxinit.MaybeRun() // does not return when started by a sandbox
	fmt.Fprintln(os.Stderr, "skein-sandbox-init: this is the first process of a plugin sandbox; skeind starts it, not people")
	os.Exit(2)
}
