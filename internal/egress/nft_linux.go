package egress

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// The router's nftables table (family inet, named NFTable) holds two
// chains of its own and nothing else:
//
//	chain forward     { type filter hook forward priority 0; policy accept;
//	                    iifname "egc*" counter   # client -> external
//	                    oifname "egc*" counter } # replies -> client
//	chain postrouting { type nat hook postrouting priority 100;
//	                    iifname "egc*" oifname OUT counter masquerade }
//
// The forward counters are the packets and bytes of Stats; the
// masquerade rule's counter (a nat chain sees each connection's first
// packet only) counts the connections SNAT'd.

var nftTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: NFTable}

const (
	tagOut  = "client-out"
	tagIn   = "client-in"
	tagMasq = "masquerade"
)

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
// empty table first makes the delete succeed when none exists).
func installNFT(c *nftables.Conn, out string) error {
	c.AddTable(nftTable)
	c.DelTable(nftTable)
	t := c.AddTable(nftTable)
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
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
