package egress

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// The router's nftables table (family inet, named NFTable) holds two
// chains and four sets of its own and nothing else:
//
//	set peers4 { type ifname . ipv4_addr }   # "egc4-0a64000a" . 10.100.0.10
//	set peers6 { type ifname . ipv6_addr }
//	set dests4 { type ipv4_addr; flags interval }  # the Egress's destinations
//	set dests6 { type ipv6_addr; flags interval }
//	chain forward     { type filter hook forward priority 0; policy accept;
//	                    iifname "egc*" meta nfproto ipv4 iifname . ip saddr != @peers4 counter drop
//	                    iifname "egc*" meta nfproto ipv6 iifname . ip6 saddr != @peers6 counter drop
//	                    iifname "egc*" meta nfproto ipv4 ip daddr != @dests4 counter drop
//	                    iifname "egc*" meta nfproto ipv6 ip6 daddr != @dests6 counter drop
//	                    iifname "egc*" counter   # client -> external
//	                    oifname "egc*" counter } # replies -> client
//	chain postrouting { type nat hook postrouting priority 100;
//	                    iifname "egc*" oifname OUT counter masquerade }
//
// The router is no open relay: what comes out of a tunnel passes only
// when its inner source is the address of that tunnel's own client (the
// pair of device and address is in peers4/peers6, which SyncPeers keeps
// in step with the tunnels: a client cannot send as another, nor as an
// address no router knows) and its destination is one of the Egress's
// (SyncDestinations; empty until then, so a new router forwards
// nothing). The drop counters are Stats' DroppedSource and
// DroppedDestination; the two counters after them are the packets and
// bytes of Stats; the masquerade rule's counter (a nat chain sees each
// connection's first packet only) counts the connections SNAT'd.

var nftTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: NFTable}

const (
	tagOut      = "client-out"
	tagIn       = "client-in"
	tagMasq     = "masquerade"
	tagDropSrc4 = "drop-source4"
	tagDropSrc6 = "drop-source6"
	tagDropDst4 = "drop-destination4"
	tagDropDst6 = "drop-destination6"
)

// The sets, by name (a Set value is only a reference to one here; AddSet
// fills in an ID, so installNFT makes its own copies).
func nftSet(name string) *nftables.Set {
	s := &nftables.Set{Table: nftTable, Name: name}
	switch name {
	case "peers4":
		s.KeyType, s.Concatenation = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr), true
	case "peers6":
		s.KeyType, s.Concatenation = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr), true
	case "dests4":
		s.KeyType, s.Interval = nftables.TypeIPAddr, true
	case "dests6":
		s.KeyType, s.Interval = nftables.TypeIP6Addr, true
	}
	return s
}

func setName(kind string, v6 bool) string {
	if v6 {
		return kind + "6"
	}
	return kind + "4"
}

func nftConn(path string) (*nftables.Conn, error) {
	var c *nftables.Conn
	err := netns.Do(path, func() error {
		var err error
		c, err = nftables.New(nftables.AsLasting())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nftables in %q: %w", path, err)
	}
	return c, nil
}

// ifname is an interface name as nftables compares it: NUL-padded to
// IFNAMSIZ, or a bare prefix for a wildcard ("egc*").
func ifname(name string, wildcard bool) []byte {
	if wildcard {
		return []byte(name)
	}
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func ifMatch(key expr.MetaKey, name string, wildcard bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name, wildcard)},
	}
}

// installNFT replaces the table atomically with a fresh copy (adding an
// empty table first makes the delete succeed when none exists); its sets
// start empty.
func installNFT(c *nftables.Conn, out string) error {
	c.AddTable(nftTable)
	c.DelTable(nftTable)
	t := c.AddTable(nftTable)
	sets := map[string]*nftables.Set{}
	for _, name := range []string{"peers4", "peers6", "dests4", "dests6"} {
		s := nftSet(name)
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nftables set %s: %w", name, err)
		}
		sets[name] = s
	}
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	// drop: iifname "egc*" meta nfproto F <key> != @set counter drop
	drop := func(tag string, v6 bool, set *nftables.Set, key ...expr.Any) {
		proto := byte(unix.NFPROTO_IPV4)
		if v6 {
			proto = unix.NFPROTO_IPV6
		}
		ex := append(ifMatch(expr.MetaKeyIIFNAME, "egc", true),
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
		ex = append(ex, key...)
		ex = append(ex, &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, UserData: []byte(tag), Exprs: ex})
	}
	// The concatenation device . address: the name fills register 1 (16
	// bytes), the address follows in register 2, as nft(8) lays it out.
	field := func(off, n uint32, reg uint32) *expr.Payload {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
	}
	iif := &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}
	drop(tagDropSrc4, false, sets["peers4"], iif, field(12, 4, 2))
	drop(tagDropSrc6, true, sets["peers6"], iif, field(8, 16, 2))
	drop(tagDropDst4, false, sets["dests4"], field(16, 4, 1))
	drop(tagDropDst6, true, sets["dests6"], field(24, 16, 1))
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, UserData: []byte(tagOut),
		Exprs: append(ifMatch(expr.MetaKeyIIFNAME, "egc", true), &expr.Counter{})})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, UserData: []byte(tagIn),
		Exprs: append(ifMatch(expr.MetaKeyOIFNAME, "egc", true), &expr.Counter{})})
	masq := append(ifMatch(expr.MetaKeyIIFNAME, "egc", true), ifMatch(expr.MetaKeyOIFNAME, out, false)...)
	c.AddRule(&nftables.Rule{Table: t, Chain: post, UserData: []byte(tagMasq),
		Exprs: append(masq, &expr.Counter{}, &expr.Masq{})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables table inet %s: %w", NFTable, err)
	}
	return nil
}

// peerElements are the elements of peers4 and peers6 for the tunnels
// (device name . client address).
func peerElements(ts []tunnel) (v4, v6 []nftables.SetElement) {
	for _, t := range ts {
		key := append(ifname(t.name, false), t.remote.AsSlice()...)
		if t.v6 {
			v6 = append(v6, nftables.SetElement{Key: key})
		} else {
			v4 = append(v4, nftables.SetElement{Key: key})
		}
	}
	return v4, v6
}

// rangeElements are the elements of an interval set holding rs (sorted,
// disjoint, not adjacent), as nft(8) writes them: an interval-end
// element at the family's zero address when the first range starts
// later, then per range its first address and, unless it runs to the
// family's end, an interval end at last+1.
func rangeElements(rs []addrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for i, r := range rs {
		if i == 0 && !r.first.IsUnspecified() {
			zero := netip.IPv4Unspecified()
			if r.first.Is6() {
				zero = netip.IPv6Unspecified()
			}
			out = append(out, nftables.SetElement{Key: zero.AsSlice(), IntervalEnd: true})
		}
		out = append(out, nftables.SetElement{Key: r.first.AsSlice()})
		if end := r.last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// replaceSets empties the named sets and fills them with elems, in one
// transaction: a packet sees the old contents or the new, never a mix.
func replaceSets(c *nftables.Conn, elems map[string][]nftables.SetElement) error {
	for name, es := range elems {
		s := nftSet(name)
		c.FlushSet(s)
		if len(es) > 0 {
			if err := c.SetAddElements(s, es); err != nil {
				return fmt.Errorf("nftables set %s: %w", name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("update nftables sets of inet %s: %w", NFTable, err)
	}
	return nil
}

func removeNFT(c *nftables.Conn) error {
	c.AddTable(nftTable)
	c.DelTable(nftTable)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove nftables table inet %s: %w", NFTable, err)
	}
	return nil
}

// nftCounters reads the counters of the table's rules by tag.
func nftCounters(c *nftables.Conn) (map[string]expr.Counter, error) {
	out := map[string]expr.Counter{}
	for _, chain := range []string{"forward", "postrouting"} {
		rs, err := c.GetRules(nftTable, &nftables.Chain{Name: chain, Table: nftTable})
		if err != nil {
			return nil, fmt.Errorf("read nftables chain %s: %w", chain, err)
		}
		for _, r := range rs {
			for _, e := range r.Exprs {
				if k, ok := e.(*expr.Counter); ok {
					out[string(r.UserData)] = *k
				}
			}
		}
	}
	return out, nil
}
