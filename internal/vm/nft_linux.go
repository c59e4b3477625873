package vm

import (
	"errors"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// The pod's bridge joins the VM to the main plugin's veth, so without a
// filter the VM's DHCP broadcasts would leave the pod (and reach any DHCP
// server on the node's side), and DHCP from outside would reach the VM.
// One bridge-family table per VM port, in the pod's namespace, drops
// DHCPv4 (UDP 67-68), DHCPv6 (UDP 546-547) and the server's router
// advertisements on the veth port, in both directions: frames arriving on
// it (prerouting), frames the bridge forwards to it (forward) and frames
// the server sends (output). The server itself listens on the bridge and
// is not affected: the bridge hands it a copy before forwarding. The same
// table drops frames from the tap whose source MAC is not the VM's: the
// guest is not trusted, and sends as itself or not at all.

func filterTable(bridge string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyBridge, Name: "skein_vm_" + bridge}
}

// nftConn opens a netlink socket for nftables inside the pod namespace;
// like every socket it keeps that namespace wherever it is used.
func nftConn(nsPath string) (*nftables.Conn, error) {
	var c *nftables.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		c, err = nftables.New(nftables.AsLasting())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nftables in %s: %w", nsPath, err)
	}
	return c, nil
}

func installFilter(nsPath, bridge, veth, tap string, vmMAC net.HardwareAddr) error {
	c, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := c.AddTable(filterTable(bridge))
	for _, ch := range []struct {
		name string
		hook *nftables.ChainHook
		key  expr.MetaKey
	}{
		{"prerouting", nftables.ChainHookPrerouting, expr.MetaKeyIIFNAME},
		{"forward", nftables.ChainHookForward, expr.MetaKeyOIFNAME},
		{"output", nftables.ChainHookOutput, expr.MetaKeyOIFNAME},
	} {
		chain := c.AddChain(&nftables.Chain{
			Name: ch.name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: ch.hook,
			Priority: nftables.ChainPriorityRef(-200), // the bridge family's "filter"
		})
		port := []expr.Any{
			&expr.Meta{Key: ch.key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(veth)},
		}
		for _, ports := range [][2]uint16{{67, 68}, {546, 547}} {
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: append(append([]expr.Any{}, port...),
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint16(ports[0]), ToData: binaryutil.BigEndian.PutUint16(ports[1])},
				&expr.Verdict{Kind: expr.VerdictDrop},
			)})
		}
		if ch.name == "prerouting" {
			// Frames from the guest carry its MAC as their source, or
			// nothing else on the bridge sees them.
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(tap)},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(vmMAC)},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
		if ch.name == "output" {
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: append(append([]expr.Any{}, port...),
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{134}}, // router advertisement
				&expr.Verdict{Kind: expr.VerdictDrop},
			)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install DHCP filter %s: %w", filterTable(bridge).Name, err)
	}
	return nil
}

func removeFilter(nsPath, bridge string) error {
	c, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	if _, err := c.ListTableOfFamily(filterTable(bridge).Name, nftables.TableFamilyBridge); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("find DHCP filter: %w", err)
	}
	c.DelTable(filterTable(bridge))
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove DHCP filter %s: %w", filterTable(bridge).Name, err)
	}
	return nil
}

func checkFilter(nsPath, bridge string) error {
	c, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := filterTable(bridge)
	if _, err := c.ListTableOfFamily(t.Name, nftables.TableFamilyBridge); err != nil {
		return fmt.Errorf("nftables table bridge %s: %w", t.Name, err)
	}
	for _, name := range []string{"prerouting", "forward", "output"} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil || len(rules) < 2 {
			return fmt.Errorf("nftables chain %s of %s lacks its rules (%v)", name, t.Name, err)
		}
	}
	return nil
}

// ifname is an interface name as nftables compares it: NUL-padded to
// IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}
