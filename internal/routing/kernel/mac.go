package kernel

import (
	"crypto/sha256"
	"net"
	"net/netip"

	"github.com/skeinnet/skein/internal/routing"
)

// MACFor is the MAC address of the VXLAN device of the node whose underlay
// address is a. Every node derives every peer's MAC from the peer's address
// alone, so FDB and neighbour entries need no exchange of MACs: the first
// six bytes of SHA-256("skein vxlan " + a), made a locally administered
// unicast address.
func MACFor(a netip.Addr) net.HardwareAddr {
	a = a.Unmap()
	b := a.As16()
	sum := sha256.Sum256(append([]byte("skein vxlan "), b[:]...))
	mac := net.HardwareAddr(sum[:6:6])
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	return mac
}

// Overhead is the VXLAN encapsulation's cost in MTU on an underlay whose
// local address is a (OverheadVXLAN4 or OverheadVXLAN6).
func Overhead(a netip.Addr) int {
	if a.Unmap().Is4() {
		return routing.OverheadVXLAN4
	}
	return routing.OverheadVXLAN6
}

// PodMTU is the largest MTU that pod traffic through a VXLAN device can have
// when the underlay link's MTU is underlayMTU and the local end is local.
func PodMTU(underlayMTU int, local netip.Addr) int {
	return underlayMTU - Overhead(local)
}
