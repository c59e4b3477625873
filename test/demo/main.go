// Command demo is `make demo`: skein's reason to exist in one run. On one
// dual-stack pool, served by one skeind for a throwaway "node" namespace,
// it attaches
//
//   - two Kubernetes-style pods through the skein CNI binary, driven by
//     libcni as containerd and CRI-O drive it;
//   - a Docker container, through a real dockerd started inside the node
//     namespace (its own data and exec roots) and skein's Docker network
//     and IPAM driver;
//   - a VM: skein then skein-vm chained through libcni, and qemu (TCG, the
//     Debian kernel `make test` caches) started by skein-vmwrapper with the
//     tap skeind hands over; the guest takes its leases from skeind's DHCP
//     server. Without a cached kernel or qemu, the VM stand-in the tests
//     use (DHCP clients in a namespace bridged next to the tap) takes its
//     place, and the demo says so.
//
// It prints a table of the four (kind, name, addresses, host link) and a
// ping matrix, every one to every other in both families, then removes
// everything, also on failure or Ctrl-C, and checks that the host is as it
// was. What it cannot run (no Docker, no qemu) it skips and says why.
//
// Usage (as root): demo -bin DIR [-vm auto|qemu|standin]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/skeinnet/skein/test/harness"
)

// cleanup runs undo steps in reverse; failed counts the ones that failed.
type cleanup struct {
	steps  []func() error
	failed int
}

func (c *cleanup) add(f func() error) { c.steps = append(c.steps, f) }
func (c *cleanup) run() {
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](); err != nil {
			fmt.Fprintln(os.Stderr, "   cleanup:", err)
			c.failed++
		}
	}
}

func main() {
	bin := flag.String("bin", "bin", "directory holding the skein binaries (make build)")
	vmMode := flag.String("vm", "auto", "the VM: qemu (a real guest), standin (a namespace with DHCP clients), or auto (qemu when it and a cached kernel are there)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: run as root (it creates network namespaces)")
		os.Exit(1)
	}
	if m := *vmMode; m != "auto" && m != "qemu" && m != "standin" {
		fmt.Fprintf(os.Stderr, "demo: -vm %q: want auto, qemu or standin\n", m)
		os.Exit(2)
	}
	// Ctrl-C cancels the run; cleanup still runs in full (further
	// signals are caught until it is done). Every process the demo starts
	// has a process group of its own, so the terminal's SIGINT does not
	// kill skeind or dockerd before they have undone their work.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	start := time.Now()
	firstRun := harness.Existing(append([]string{harness.NetNSDir}, harness.FirstRunPaths...))
	before, err := snapshotHost()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	d := &demo{bin: *bin, vmMode: *vmMode}
	var c cleanup
	err = d.run(ctx, &c)
	if ctx.Err() != nil {
		err = errors.New("interrupted")
	}
	fmt.Println("\n== cleaning up")
	c.run()
	// dockerd and containerd's shims create a few files on their first run
	// ever on a machine; the demo removes them if it made them.
	removed, terr := harness.TidyFirstRun(firstRun)
	for _, p := range removed {
		fmt.Printf("   removed %s (dockerd or containerd created it on their first run here)\n", p)
	}
	err = errors.Join(err, terr)
	if gone, nerr := harness.TidyNetNSDir(firstRun[harness.NetNSDir]); gone {
		fmt.Printf("   removed %s (the demo's namespaces made it; a fresh machine has none)\n", harness.NetNSDir)
	} else if nerr != nil {
		err = errors.Join(err, nerr)
	}
	stop()
	if c.failed > 0 {
		err = errors.Join(err, fmt.Errorf("%d cleanup step(s) failed", c.failed))
	}
	err = errors.Join(err, d.checkHost(before))
	for _, s := range d.skipped {
		fmt.Println("   skipped:", s)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
	skipped := ""
	if n := len(d.skipped); n > 0 {
		skipped = fmt.Sprintf(" (%d part(s) skipped, see above)", n)
	}
	fmt.Printf("== done in %v%s: the host is as it was (namespaces, links, addresses, routes, rules, nftables, mounts, files; no process left)\n",
		time.Since(start).Round(100*time.Millisecond), skipped)
}

// checkHost compares the host with its state before the demo and looks
// for processes the demo started that outlived it.
//
// Where the demo shares a place with other programs — /run/netns,
// /run/docker/plugins, the temporary directory — everything it makes
// carries its name; a difference there that does not is another
// program's (a test suite running at the same time) and is only shown.
// Any other difference fails the demo.
func (d *demo) checkHost(before hostState) error {
	after, err := snapshotHost()
	if err != nil {
		return err
	}
	var errs []error
	gone, added := before.diff(after)
	var mine, others []string
	for _, l := range [][]string{gone, added} {
		var m, o []string
		for _, s := range l {
			if d.foreign(s) {
				o = append(o, s)
			} else {
				m = append(m, s)
			}
		}
		mine, others = append(mine, strings.Join(m, "\n         ")), append(others, strings.Join(o, "\n         "))
	}
	if mine[0]+mine[1] != "" {
		errs = append(errs, fmt.Errorf("the host changed:\n  gone:  %s\n  added: %s", mine[0], mine[1]))
	}
	if others[0]+others[1] != "" {
		fmt.Printf("   note: other programs changed the host meanwhile (nothing of the demo's):\n     gone:  %s\n     added: %s\n",
			strings.ReplaceAll(others[0], "\n         ", "\n            "), strings.ReplaceAll(others[1], "\n         ", "\n            "))
	}
	if d.dir != "" {
		if left := leftoverProcesses(d.dir); len(left) > 0 {
			errs = append(errs, fmt.Errorf("processes left running:\n  %s", strings.Join(left, "\n  ")))
		}
	}
	return errors.Join(errs...)
}

// foreign reports whether a line of hostState names something in a
// shared place that is not the demo's.
func (d *demo) foreign(line string) bool {
	f := strings.Fields(line)
	if len(f) < 2 || (f[0] != "path" && f[0] != "mount") {
		return false
	}
	p := f[1]
	under := func(dir string) (string, bool) {
		rest, ok := strings.CutPrefix(p, dir+"/")
		return rest, ok && rest != ""
	}
	if rest, ok := under("/run/netns"); ok {
		return !strings.HasPrefix(rest, "skein-demo-")
	}
	if rest, ok := under(pluginDir); ok {
		return d.plugin == "" || rest != d.plugin+".sock"
	}
	if _, ok := under(strings.TrimSuffix(os.TempDir(), "/")); ok {
		return d.dir == "" || (p != d.dir && !strings.HasPrefix(p, d.dir+"/"))
	}
	return false
}
