package kernel

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// The VXLAN device takes any packet that reaches its UDP port with its VNI
// and its MAC as the inner destination, and both are public (the VNI is
// configuration, the MAC is MACFor of the node's address). Without a
// guard, anything that can send UDP to the node (a host on the underlay,
// a pod of any node) could put frames on skein.vxlan with any inner
// source: a pod's address, to reach pods here as that pod. So, in vxlan
// mode, a table of skein's own drops packets to the VXLAN port from any
// source but the peers the FDB sends to (the other nodes' underlay
// addresses), before the kernel's UDP socket sees them:
//
//	table inet skein_vxlan {
//		set peers4 { type ipv4_addr; elements = { ... } }
//		set peers6 { type ipv6_addr; elements = { ... } }
//		chain input { type filter hook input priority -10; policy accept;
//			meta nfproto ipv4 udp dport Port ip saddr != @peers4 drop
//			meta nfproto ipv6 udp dport Port ip6 saddr != @peers6 drop
//		}
//	}
//
// The table is replaced whole, in one transaction, whenever the peers
// change, and deleted with the device (other modes, Uninstall).
const guardTable = "skein_vxlan"

func (k *Kernel) nftConn() (*nftables.Conn, error) {
	var c *nftables.Conn
	open := func() error {
		var err error
		c, err = nftables.New(nftables.AsLasting())
		return err
	}
	var err error
	if k.cfg.NodeNetNS == "" {
		err = open()
	} else {
		err = netns.Do(k.cfg.NodeNetNS, open)
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return c, nil
}

// setGuard makes the guard table admit VXLAN packets from peers alone.
func (k *Kernel) setGuard(peers map[string]netip.Addr) error {
	c, err := k.nftConn()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: guardTable}
	// Add (a no-op if it is there), delete, add: the old table goes and
	// the new one comes in the same transaction, with no moment unguarded.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(-10)})
	var v4, v6 []nftables.SetElement
	for _, p := range sortedPeers(peers) {
		if p.Is4() {
			v4 = append(v4, nftables.SetElement{Key: p.AsSlice()})
		} else {
			v6 = append(v6, nftables.SetElement{Key: p.AsSlice()})
		}
	}
	for _, fam := range []struct {
		name    string
		typ     nftables.SetDatatype
		nfproto byte
		saddr   uint32 // offset of the source address in the network header
		len     uint32
		elems   []nftables.SetElement
	}{
		{"peers4", nftables.TypeIPAddr, unix.NFPROTO_IPV4, 12, 4, v4},
		{"peers6", nftables.TypeIP6Addr, unix.NFPROTO_IPV6, 8, 16, v6},
	} {
		set := &nftables.Set{Table: t, Name: fam.name, KeyType: fam.typ}
		if err := c.AddSet(set, fam.elems); err != nil {
			return fmt.Errorf("vxlan guard set %s: %w", fam.name, err)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{fam.nfproto}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(k.cfg.VXLAN.Port))},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.saddr, Len: fam.len},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("vxlan guard (nftables table inet %s): %w", guardTable, err)
	}
	return nil
}

// deleteGuard deletes the guard table if it is there.
func (k *Kernel) deleteGuard() error {
	c, err := k.nftConn()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	if _, err := c.ListTableOfFamily(guardTable, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("find vxlan guard: %w", err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: guardTable})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete vxlan guard (nftables table inet %s): %w", guardTable, err)
	}
	return nil
}

func sortedPeers(peers map[string]netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, p := range peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}
