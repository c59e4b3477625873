package router

import (
	"bytes"
	"fmt"
	"os"

	"github.com/skeinnet/skein/internal/netns"
)

// Sysctls a router needs in its network namespace: it forwards between
// the tunnels and the outbound interface, and the decapsulated packets of
// a client arrive on its tunnel while the route back to the client's
// address (before the router's policy rule) points elsewhere, which a
// strict reverse-path filter drops. "default" covers tunnels made later.
func routerSysctls(v4, v6 bool) map[string]string {
	m := map[string]string{}
	if v4 {
		m["net/ipv4/ip_forward"] = "1"
		m["net/ipv4/conf/all/rp_filter"] = "0"
		m["net/ipv4/conf/default/rp_filter"] = "0"
	}
	if v6 {
		m["net/ipv6/conf/all/forwarding"] = "1"
	}
	return m
}

// EnableForwarding sets the router's sysctls in the network namespace at
// path ("" = the current one). A value already right is not written, so
// a pod whose sysctls were set for it (pod securityContext.sysctls) needs
// no write access to /proc/sys; otherwise the container must be
// privileged, since runtimes mount /proc/sys read-only.
func EnableForwarding(path string, v4, v6 bool) error {
	set := func() error {
		for key, want := range routerSysctls(v4, v6) {
			file := "/proc/sys/" + key
			cur, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("read sysctl %s: %w", key, err)
			}
			if string(bytes.TrimSpace(cur)) == want {
				continue
			}
			if err := os.WriteFile(file, []byte(want), 0o644); err != nil {
				return fmt.Errorf("set sysctl %s to %s (a router pod must be privileged, or have it set through its securityContext.sysctls): %w", key, want, err)
			}
		}
		return nil
	}
	if path == "" {
		return set()
	}
	return netns.Do(path, set)
}
