package guest

import (
	"fmt"
	"strings"

	"github.com/skeinnet/skein/test/skeintest"
)

const busybox = skeintest.Busybox

// The guest reaches chosen ports of the host's loopback through qemu's
// user-mode network (slirp) in restricted mode: the guest's packets go
// nowhere except to the guestfwd entries, each of which qemu forwards to
// 127.0.0.1:port on the host. No tap, no bridge, nothing on the host's
// network changes; qemu is a plain process making loopback connections.
//
// A guestfwd to a chardev ("-tcp:127.0.0.1:port") carries one connection
// for the guest's whole life (seen here: the second GET hangs), so each
// entry runs a command per connection instead: busybox nc, the harness's
// prerequisite anyway, piping the guest's connection to the port.
//
// Guest side: eth0 (virtio-net) with guestAddr/24 on slirp's default
// network, HostAddr on-link, no default route.
const (
	guestAddr   = "10.0.2.15"
	slirpNet    = "10.0.2.0/24"
	netdevID    = "hostports"
	guestNICMod = "virtio_net"
)

// netModules are the modules the guest's NIC needs (none without one).
func netModules(cfg Config) []string {
	if len(cfg.HostPorts) == 0 {
		return nil
	}
	return []string{"virtio_pci", guestNICMod}
}

// netArgs are qemu's network options: none at all without HostPorts.
func netArgs(cfg Config) []string {
	if len(cfg.HostPorts) == 0 {
		return []string{"-nic", "none"}
	}
	netdev := []string{"user", "id=" + netdevID, "restrict=on", "net=" + slirpNet}
	for _, p := range cfg.HostPorts {
		netdev = append(netdev, fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s nc 127.0.0.1 %d", HostAddr, p, busybox, p))
	}
	return []string{
		"-netdev", strings.Join(netdev, ","),
		"-device", "virtio-net-pci,netdev=" + netdevID + ",romfile=",
	}
}

// networkScript is /init's part configuring eth0 (empty without a NIC).
func networkScript(cfg Config) string {
	if len(cfg.HostPorts) == 0 {
		return ""
	}
	return fmt.Sprintf(`ip link set eth0 up || fail "eth0 up"
ip addr add %s/24 dev eth0 || fail "eth0 address"`, guestAddr)
}

// checkHostPorts rejects ports that are no TCP port or listed twice.
func checkHostPorts(ports []int) error {
	seen := map[int]bool{}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("host port %d is no TCP port", p)
		}
		if seen[p] {
			return fmt.Errorf("host port %d listed twice", p)
		}
		seen[p] = true
	}
	return nil
}
