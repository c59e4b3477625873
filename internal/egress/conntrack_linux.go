package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// A router's conntrack table holds an entry per session it SNATs, so it
// grows with the clients' traffic (tens of thousands of entries on a busy
// gateway), and Stats counts them at every metrics scrape. The count
// streams the dump over a socket of its own and reads only the two
// addresses it needs from each entry, instead of decoding every entry
// into a flow object first.

// ctSocket opens a netfilter netlink socket in the namespace at path.
func ctSocket(path string) (*nl.NetlinkSocket, error) {
	var s *nl.NetlinkSocket
	err := netns.Do(path, func() error {
		var err error
		s, err = nl.Subscribe(unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netfilter netlink socket in %q: %w", path, err)
	}
	return s, nil
}

// Attribute types of a conntrack entry (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaTupleIP    = 1
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	nlaTypeMask   = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

// countSNAT counts the conntrack entries of one family (AF_INET or
// AF_INET6) whose original source is in peers and whose reply goes to
// another address: the sessions SNAT'd for clients. A dump the kernel
// flags as interrupted is counted as far as it went (a gauge).
func countSNAT(s *nl.NetlinkSocket, family uint8, peers map[netip.Addr]bool) (int, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: s}}
	n := 0
	err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if len(msg) < nl.SizeofNfgenmsg || msg[0] != family { // only this family's, on any kernel
			return true
		}
		attrs := msg[nl.SizeofNfgenmsg:]
		src := ctAddr(nlaGet(nlaGet(attrs, ctaTupleOrig), ctaTupleIP), ctaIPv4Src, ctaIPv6Src)
		if !peers[src] {
			return true
		}
		if dst := ctAddr(nlaGet(nlaGet(attrs, ctaTupleReply), ctaTupleIP), ctaIPv4Dst, ctaIPv6Dst); dst != src {
			n++
		}
		return true
	})
	if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
		return 0, fmt.Errorf("dump conntrack: %w", err)
	}
	return n, nil
}

// nlaGet returns the payload of the first attribute of type typ in b, or
// nil.
func nlaGet(b []byte, typ uint16) []byte {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofNlAttr || l > len(b) {
			return nil
		}
		if binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask == typ {
			return b[unix.SizeofNlAttr:l]
		}
		if l = (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1); l >= len(b) {
			return nil
		}
		b = b[l:]
	}
	return nil
}

// ctAddr reads the address of type t4 (IPv4) or t6 (IPv6) from a
// CTA_TUPLE_IP payload.
func ctAddr(b []byte, t4, t6 uint16) netip.Addr {
	if v := nlaGet(b, t4); len(v) == 4 {
		return netip.AddrFrom4([4]byte(v))
	}
	if v := nlaGet(b, t6); len(v) == 16 {
		return netip.AddrFrom16([16]byte(v))
	}
	return netip.Addr{}
}
