package vm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/vm/handover"
)

// claimToken writes the token of containerID; the caller's record of an
// attachment of containerID is already stored.
func (s *Service) claimToken(containerID string) error {
	unlock := s.containers.Lock(containerID)
	defer unlock()
	return s.tokens.write(containerID)
}

// releaseToken removes the token of containerID unless a record of an
// attachment of containerID is left; the caller's record is already gone.
func (s *Service) releaseToken(ctx context.Context, containerID string) error {
	unlock := s.containers.Lock(containerID)
	defer unlock()
	recs, err := s.records(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Key.ContainerID == containerID {
			return nil
		}
	}
	return s.tokens.remove(containerID)
}

// openTaps answers the handover socket: the taps of every VM attachment
// of the container, in key order, if the token is the container's; or,
// for a request by namespace, of every attachment in that namespace (ns,
// a descriptor the caller sent: having it is the proof).
func (s *Service) openTaps(req handover.Request, ns *os.File) ([]handover.Interface, []*os.File, error) {
	var mine func(record) bool
	if req.NetNS {
		id, err := netnsID(ns)
		if err != nil {
			return nil, nil, err
		}
		mine = func(r record) bool {
			var st unix.Stat_t
			return unix.Stat(r.NetNS, &st) == nil && [2]uint64{st.Dev, st.Ino} == id
		}
	} else {
		if cni.ValidateContainerID(req.ContainerID) != nil || !s.tokens.valid(req.ContainerID, req.Token) {
			return nil, nil, errors.New("unknown container or wrong token")
		}
		mine = func(r record) bool { return r.Key.ContainerID == req.ContainerID }
	}
	recs, err := s.records(context.Background())
	if err != nil {
		return nil, nil, err
	}
	var ifs []handover.Interface
	var files []*os.File
	fail := func(err error) ([]handover.Interface, []*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, err
	}
	for _, r := range recs {
		if !mine(r) {
			continue
		}
		for _, p := range r.Ports {
			f, err := OpenTap(r.NetNS, p.Tap)
			if err != nil {
				return fail(fmt.Errorf("open tap %s of %s: %w", p.Tap, r.Key, err))
			}
			files = append(files, f)
			itf := handover.Interface{Network: r.Key.Network, IfName: p.Veth, Tap: p.Tap, MAC: p.Lease.MAC, MTU: p.Lease.MTU, NetNS: r.NetNS}
			for _, a := range []netip.Prefix{p.Lease.Addr4, p.Lease.Addr6} {
				if a.IsValid() {
					itf.Addresses = append(itf.Addresses, a.String())
				}
			}
			ifs = append(ifs, itf)
		}
	}
	if len(ifs) == 0 {
		if req.NetNS {
			return nil, nil, errors.New("no VM attachment in this network namespace")
		}
		return nil, nil, errors.New("unknown container or wrong token")
	}
	if len(ifs) > handover.MaxInterfaces {
		return fail(fmt.Errorf("%d interfaces: more than %d", len(ifs), handover.MaxInterfaces))
	}
	return ifs, files, nil
}

// netnsID identifies the network namespace f is a descriptor of (the
// device and inode its path also has), refusing any other file.
func netnsID(f *os.File) ([2]uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return [2]uint64{}, fmt.Errorf("the descriptor sent: %w", err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return [2]uint64{}, errors.New("the descriptor sent is not a namespace")
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return [2]uint64{}, errors.New("the descriptor sent is not a network namespace")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return [2]uint64{}, fmt.Errorf("the descriptor sent: %w", err)
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}
