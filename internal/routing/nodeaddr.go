package routing

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// ParseNodeAddresses reads a node address list: the value of
// skeind --node-address or of the skein.dev/node-address annotation, comma
// separated, at most one address per family. Every address must be a
// unicast address a peer can send to: not unspecified, loopback,
// multicast, link-local, or with a zone.
func ParseNodeAddresses(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty node address list")
	}
	var out []netip.Addr
	var have4, have6 bool
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("node address %q: %w", f, err)
		}
		a = a.Unmap()
		switch {
		case a.Zone() != "":
			return nil, fmt.Errorf("node address %q: a zone is not allowed", f)
		case !reachable(a):
			return nil, fmt.Errorf("node address %q: not a unicast address other nodes can reach", f)
		}
		have := &have6
		if a.Is4() {
			have = &have4
		}
		if *have {
			return nil, fmt.Errorf("node address list %q: more than one address of a family", s)
		}
		*have = true
		out = append(out, a)
	}
	return out, nil
}

// reachable: a is a unicast address without a zone that other nodes can
// send to (not unspecified, loopback, multicast, link-local).
func reachable(a netip.Addr) bool {
	a = a.Unmap()
	return a.Zone() == "" && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast() &&
		!a.IsInterfaceLocalMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// NodeAddresses returns node's underlay addresses: the
// skein.dev/node-address annotation when it is set and valid, else the
// node's InternalIPs (the first of each family that other nodes can
// reach, checked as the annotation's addresses are). A set but invalid
// annotation is returned as badAnnotation, and the InternalIPs are used.
func NodeAddresses(node *corev1.Node) (addrs []netip.Addr, badAnnotation error) {
	if v, ok := node.Annotations[skeinv1.AnnotationNodeAddress]; ok {
		a, err := ParseNodeAddresses(v)
		if err == nil {
			return a, nil
		}
		badAnnotation = fmt.Errorf("annotation %s: %w", skeinv1.AnnotationNodeAddress, err)
	}
	var have4, have6 bool
	for _, na := range node.Status.Addresses {
		if na.Type != corev1.NodeInternalIP {
			continue
		}
		a, err := netip.ParseAddr(na.Address)
		if err != nil || !reachable(a) {
			continue // as the annotation's: a peer could not send there
		}
		a = a.Unmap()
		have := &have6
		if a.Is4() {
			have = &have4
		}
		if !*have {
			*have = true
			addrs = append(addrs, a)
		}
	}
	return addrs, badAnnotation
}
