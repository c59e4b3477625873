package daemon

import (
	"fmt"
	"log/slog"

	"github.com/skeinnet/skein/internal/netns"
)

// hostNamespaces identifies the namespaces a pod's CNI_NETNS must never
// name: the node's (where skeind plumbs the host side; nodeNetNS, or
// skeind's own when empty), skeind's own, and the host's (that of PID 1).
// Plumbing a "pod" there would put an eth0 with a pod address and a
// default route into the host. A namespace that cannot be read (no
// /proc/1 access in a container) is left out, with a log line.
func hostNamespaces(nodeNetNS string, log *slog.Logger) map[netns.ID]string {
	out := map[netns.ID]string{}
	for _, c := range []struct{ path, what string }{
		{"/proc/1/ns/net", "the host's network namespace (PID 1's)"},
		{"/proc/self/ns/net", "skeind's own network namespace"},
		{nodeNetNS, "the node's network namespace"},
	} {
		if c.path == "" {
			continue
		}
		id, err := netns.IDOf(c.path)
		if err != nil {
			log.Warn("cannot identify a namespace pods must not use", "path", c.path, "err", err)
			continue
		}
		out[id] = c.what // the node's wins when they are one
	}
	return out
}

// checkPodNetNS refuses a pod namespace that is the node's, skeind's or
// the host's.
func (d *Daemon) checkPodNetNS(path string) error {
	id, err := netns.IDOf(path)
	if err != nil {
		return fmt.Errorf("CNI_NETNS %q: %w", path, err)
	}
	if what, ok := d.hostNS[id]; ok {
		return fmt.Errorf("CNI_NETNS %q is %s, not a pod's: refusing to plumb a pod interface into it", path, what)
	}
	return nil
}
