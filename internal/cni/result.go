package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Attached describes what skeind plumbed for one ADD.
type Attached struct {
	HostName     string
	HostMAC      string
	IfName       string
	ContainerMAC string
	Sandbox      string // the netns path
	Addrs        []netip.Addr
	GatewayV4    netip.Addr
	GatewayV6    netip.Addr
}

// BuildResult makes the ADD result: skein's interfaces, addresses and
// default routes, appended to prevResult when skein runs chained after
// another plugin. The result's version is the configuration's.
//
// A 0.1.0 or 0.2.0 result holds one address per family and no
// interfaces, so of a chain's addresses only the first of each family
// survives the conversion: there skein's own addresses go first, since
// they are what CNI_IFNAME carries.
func BuildResult(c *NetConf, a Attached) (types.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if c.PrevResult != nil {
		prev, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
		}
		// A 1.x prevResult comes back as itself: append to copies, so
		// that the configuration's prevResult stays what it was.
		cp := *prev
		cp.Interfaces, cp.IPs, cp.Routes = slices.Clone(prev.Interfaces), slices.Clone(prev.IPs), slices.Clone(prev.Routes)
		res = &cp
	}
	host := len(res.Interfaces)
	res.Interfaces = append(res.Interfaces,
		&current.Interface{Name: a.HostName, Mac: a.HostMAC},
		&current.Interface{Name: a.IfName, Mac: a.ContainerMAC, Sandbox: a.Sandbox},
	)
	ctr := host + 1
	prevIPs := res.IPs
	if LegacyResult(c.CNIVersion) {
		res.IPs = nil
	}
	for _, addr := range a.Addrs {
		gw := a.GatewayV4
		dst := net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if addr.Is6() {
			gw = a.GatewayV6
			dst = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(ctr),
			Address:   hostNet(addr),
			Gateway:   gw.AsSlice(),
		})
		res.Routes = append(res.Routes, &types.Route{Dst: dst, GW: gw.AsSlice()})
	}
	if LegacyResult(c.CNIVersion) {
		res.IPs = append(res.IPs, prevIPs...)
	}
	if len(res.DNS.Nameservers) == 0 && len(res.DNS.Search) == 0 && len(res.DNS.Options) == 0 && res.DNS.Domain == "" {
		res.DNS = c.DNS
	}
	return res.GetAsVersion(c.CNIVersion)
}

// Encode renders a result in version ver as the runtime reads it.
func Encode(r types.Result, ver string) ([]byte, error) {
	v, err := r.GetAsVersion(ver)
	if err != nil {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("cannot convert result to %s: %v", ver, err), "")
	}
	return json.Marshal(v)
}

// PrevAddrs returns the addresses prevResult assigns to the container
// interface named ifName (in sandbox netns), for CHECK.
func PrevAddrs(c *NetConf, ifName string) ([]netip.Addr, error) {
	if c.PrevResult == nil {
		return nil, nil
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	var out []netip.Addr
	for _, ip := range prev.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(prev.Interfaces) {
			continue
		}
		if i := prev.Interfaces[*ip.Interface]; i.Name == ifName && i.Sandbox != "" {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

// HasSandboxInterface reports whether r names an interface called name
// inside a sandbox (a pod's side, not the host's).
func HasSandboxInterface(r *current.Result, name string) bool {
	for _, i := range r.Interfaces {
		if i.Name == name && i.Sandbox != "" {
			return true
		}
	}
	return false
}

// EncodeResult is BuildResult then Encode in the configuration's version,
// byte for byte. For the common case — a 1.x configuration without
// prevResult — it writes the JSON directly: the CNI library's 1.x
// Result.MarshalJSON marshals the struct, decodes it into a map and
// marshals the map (for the sorted keys and a dropped empty "dns"), which
// took ~100 µs of a CNI ADD in skeind (docs/benchmarks/report.md).
func EncodeResult(c *NetConf, a Attached) ([]byte, error) {
	if c.PrevResult != nil || c.CNIVersion != "1.0.0" && c.CNIVersion != "1.1.0" {
		res, err := BuildResult(c, a)
		if err != nil {
			return nil, err
		}
		return Encode(res, c.CNIVersion)
	}
	// The keys in the order the library's map marshalling sorts them, the
	// strings escaped as encoding/json escapes them.
	b := append(make([]byte, 0, 512), `{"cniVersion":`...)
	b = appendJSONString(b, c.CNIVersion)
	if !dnsEmpty(c.DNS) {
		b = append(b, `,"dns":{`...)
		sep := ""
		field := func(k string) {
			b = append(b, sep...)
			b = appendJSONString(b, k)
			b = append(b, ':')
			sep = ","
		}
		list := func(k string, l []string) {
			if len(l) > 0 {
				field(k)
				b = append(b, '[')
				for i, s := range l {
					if i > 0 {
						b = append(b, ',')
					}
					b = appendJSONString(b, s)
				}
				b = append(b, ']')
			}
		}
		if c.DNS.Domain != "" {
			field("domain")
			b = appendJSONString(b, c.DNS.Domain)
		}
		list("nameservers", c.DNS.Nameservers)
		list("options", c.DNS.Options)
		list("search", c.DNS.Search)
		b = append(b, '}')
	}
	b = append(b, `,"interfaces":[`...)
	b = appendInterface(b, a.HostMAC, a.HostName, "")
	b = append(b, ',')
	b = appendInterface(b, a.ContainerMAC, a.IfName, a.Sandbox)
	b = append(b, ']')
	if len(a.Addrs) > 0 {
		b = append(b, `,"ips":[`...)
		for i, addr := range a.Addrs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"address":`...)
			b = appendJSONString(b, hostPrefix(addr))
			if gw := gatewayOf(a, addr); gw.IsValid() {
				b = append(b, `,"gateway":`...)
				b = appendJSONString(b, gw.String())
			}
			b = append(b, `,"interface":1}`...)
		}
		b = append(b, `],"routes":[`...)
		for i, addr := range a.Addrs {
			if i > 0 {
				b = append(b, ',')
			}
			dst := "0.0.0.0/0"
			if addr.Is6() {
				dst = "::/0"
			}
			b = append(b, `{"dst":`...)
			b = appendJSONString(b, dst)
			if gw := gatewayOf(a, addr); gw.IsValid() {
				b = append(b, `,"gw":`...)
				b = appendJSONString(b, gw.String())
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

func appendInterface(b []byte, mac, name, sandbox string) []byte {
	b = append(b, '{')
	if mac != "" {
		b = append(b, `"mac":`...)
		b = appendJSONString(b, mac)
		b = append(b, ',')
	}
	b = append(b, `"name":`...)
	b = appendJSONString(b, name)
	if sandbox != "" {
		b = append(b, `,"sandbox":`...)
		b = appendJSONString(b, sandbox)
	}
	return append(b, '}')
}

// gatewayOf is the gateway BuildResult gives addr.
func gatewayOf(a Attached, addr netip.Addr) netip.Addr {
	if addr.Is6() {
		return a.GatewayV6
	}
	return a.GatewayV4
}

// hostPrefix is addr as a host prefix, as types.IPNet prints hostNet(addr).
func hostPrefix(addr netip.Addr) string {
	n := hostNet(addr)
	return n.String()
}

func dnsEmpty(d types.DNS) bool {
	return len(d.Nameservers) == 0 && d.Domain == "" && len(d.Search) == 0 && len(d.Options) == 0
}

// appendJSONString appends s as the library's result ends up written: it
// is marshalled, decoded and marshalled again, so each byte that is not
// UTF-8 becomes a literal U+FFFD (one marshal alone would write "\ufffd").
func appendJSONString(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		valid := make([]byte, 0, len(s)+8)
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			valid = utf8.AppendRune(valid, r) // RuneError for a bad byte
			i += n
		}
		s = string(valid)
	}
	q, _ := json.Marshal(s)
	return append(b, q...)
}
