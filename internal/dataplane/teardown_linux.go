package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Teardown removes the attachment whose host veth is hostName. Deleting the
// host veth takes its peer, the pod's addresses and routes, and the host
// routes in PodTable with it, in one kernel operation. Teardown returns
// once the kernel has unregistered both ends, before it has freed them
// (see unlisted): by then nothing of the pair can be seen, and its names
// and addresses can be used again.
//
// It is idempotent: it succeeds when the link, the namespace or both are
// already gone. If no link is called hostName, it looks for the pair from the
// pod side (ifName in netnsPath) and deletes the host end only if it is a
// skein-tagged veth whose peer is that very interface. A link named hostName
// without skein's alias gives ErrNotOwned and is left alone.
//
// addrs is accepted for symmetry with Setup but routes are not deleted by
// address: they vanish with the link, and by the time a DEL runs the address
// may already route to a new pod.
func (d *Dataplane) Teardown(hostName, netnsPath, ifName string, addrs []netip.Addr) (retErr error) {
	defer wrap(&retErr, "teardown", hostName)
	_ = addrs
	h, put, err := d.acquire()
	if err != nil {
		return err
	}
	defer put()
	link, err := h.LinkByName(hostName)
	switch {
	case err == nil:
		if !d.owned(link) {
			return fmt.Errorf("alias %q: %w", link.Attrs().Alias, ErrNotOwned)
		}
		return d.deleteLink(link)
	case !isNotFound(err):
		return fmt.Errorf("find host veth: %w", err)
	}
	if netnsPath == "" || ifName == "" {
		return nil
	}
	link, err = d.hostEndFromPod(h, netnsPath, ifName)
	if err != nil || link == nil {
		return err
	}
	return d.deleteLink(link)
}

// hostEndFromPod finds the host end of the veth called ifName in the pod
// namespace, or nil if there is none that skein owns.
func (d *Dataplane) hostEndFromPod(h *netlink.Handle, netnsPath, ifName string) (netlink.Link, error) {
	if err := netns.IsNetNS(netnsPath); err != nil {
		if errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetNS) {
			return nil, nil // nothing of ours can be behind it
		}
		return nil, err
	}
	pod, closePod, err := netns.Handle(netnsPath)
	if err != nil {
		if errors.Is(err, netns.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer closePod()
	ctr, err := pod.LinkByName(ifName)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("find %s in pod: %w", ifName, err)
	}
	if ctr.Type() != "veth" || ctr.Attrs().ParentIndex == 0 {
		return nil, nil
	}
	host, err := h.LinkByIndex(ctr.Attrs().ParentIndex)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("find peer of %s: %w", ifName, err)
	}
	if host.Type() != "veth" || host.Attrs().ParentIndex != ctr.Attrs().Index || !d.owned(host) {
		return nil, nil
	}
	return host, nil
}

// owned reports whether a node link is one of skein's host veths: a veth
// tagged with the alias, or — the window between creating a veth and
// tagging it, which a crash can leave open, since the kernel ignores the
// alias in a create request — an untagged veth whose name has the shape of
// skein's host names (IsHostName). Only veths: other parts of skein tag
// their links with aliases under the same prefix (the routing VXLAN device,
// "skein:routing:vxlan"), and those are not pod links to tear down.
func (d *Dataplane) owned(l netlink.Link) bool {
	if l.Type() != "veth" {
		return false
	}
	a := l.Attrs()
	if strings.HasPrefix(a.Alias, d.cfg.AliasPrefix) {
		return true
	}
	return a.Alias == "" && IsHostName(a.Name)
}

// HostNamePrefix starts every host-side veth name skein makes.
const HostNamePrefix = "sk"

// IsHostName reports whether name has the shape of skein's host veth
// names: HostNamePrefix and 12 lower-case hex digits.
func IsHostName(name string) bool {
	if len(name) != len(HostNamePrefix)+12 || !strings.HasPrefix(name, HostNamePrefix) {
		return false
	}
	for _, c := range name[len(HostNamePrefix):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}

// Retag sets the ownership alias on host link hostName (an ADD cut short
// between creating the veth and tagging it leaves it untagged).
func (d *Dataplane) Retag(hostName, alias string) (retErr error) {
	defer wrap(&retErr, "retag", hostName)
	h, put, err := d.acquire()
	if err != nil {
		return err
	}
	defer put()
	link, err := h.LinkByName(hostName)
	if err != nil {
		return err
	}
	if !d.owned(link) {
		return fmt.Errorf("alias %q: %w", link.Attrs().Alias, ErrNotOwned)
	}
	return h.LinkSetAlias(link, alias)
}
