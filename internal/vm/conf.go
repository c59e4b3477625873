package vm

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/skeinnet/skein/internal/cni"
)

// NetConf is skein-vm's network configuration: the spec's fields (the main
// plugin's result arrives as prevResult) plus skein-vm's own. Zero values:
// Socket "" = the default skeind socket; LeaseSeconds 0 = DefaultLease.
type NetConf struct {
	types.PluginConf
	// Socket is skeind's gRPC socket; read by the skein-vm binary only.
	Socket string `json:"socket,omitempty"`
	// LeaseSeconds is the DHCP lease time served; renewal (T1) is at half
	// of it, rebinding (T2) at 7/8.
	LeaseSeconds int `json:"leaseSeconds,omitempty"`
	// PodAnnotation, when set, makes skein-vm act only for pods whose
	// annotation of that name is "true": with skein-vm chained in a
	// node's only conflist, ordinary pods keep their interface and VM
	// pods ask for a bridge and a tap. The annotations come from
	// runtimeConfig (the io.kubernetes.cri.pod-annotations capability,
	// which the conflist must give skein-vm). Empty: every pod is a VM.
	PodAnnotation string `json:"podAnnotation,omitempty"`
	// RuntimeConfig holds what the runtime passes for the capabilities.
	RuntimeConfig struct {
		Annotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	} `json:"runtimeConfig,omitzero"`
}

// PodAnnotationsCapability is the runtimeConfig key of the pod's
// annotations (containerd and CRI-O fill it in).
const PodAnnotationsCapability = "io.kubernetes.cri.pod-annotations"

// WantsVM reports whether this call is for a VM: always without
// PodAnnotation; else the pod's annotation must be "true" ("false" or
// none: not a VM). Any other value is an error naming the annotation, so
// a typo is not silently a plain pod.
func (c *NetConf) WantsVM() (bool, error) {
	if c.PodAnnotation == "" {
		return true, nil
	}
	switch v, ok := c.RuntimeConfig.Annotations[c.PodAnnotation]; {
	case !ok || v == "false":
		return false, nil
	case v == "true":
		return true, nil
	default:
		return false, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("pod annotation %s=%q: want \"true\" (a VM) or \"false\"", c.PodAnnotation, v), "")
	}
}

// DefaultLease is the lease time when the configuration names none.
const DefaultLease = time.Hour

// ParseConf decodes and validates skein-vm's configuration. Errors are
// *types.Error with the spec's codes. requirePrev: ADD and CHECK need the
// main plugin's result; DEL, GC and STATUS do not.
func ParseConf(data []byte, requirePrev bool) (*NetConf, error) {
	var c NetConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode network configuration: "+err.Error(), "")
	}
	if c.CNIVersion == "" {
		c.CNIVersion = "0.1.0"
	}
	if !slices.Contains(cni.SupportedVersions, c.CNIVersion) {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("cniVersion %q is not supported", c.CNIVersion),
			"skein-vm supports "+strings.Join(cni.SupportedVersions, ", "))
	}
	if err := cni.ValidateNetworkName(c.Name); err != nil {
		return nil, err
	}
	if c.LeaseSeconds < 0 || c.LeaseSeconds != 0 && c.LeaseSeconds < 10 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("leaseSeconds %d: must be at least 10", c.LeaseSeconds), "")
	}
	if c.PodAnnotation != "" {
		if errs := validation.IsQualifiedName(c.PodAnnotation); len(errs) > 0 {
			return nil, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("podAnnotation %q is not an annotation name: %s", c.PodAnnotation, strings.Join(errs, "; ")), "")
		}
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "cannot decode prevResult: "+err.Error(), "")
		}
		if err := cni.CheckPrevResult(c.PrevResult); err != nil {
			return nil, err
		}
	}
	if requirePrev && c.PrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			"skein-vm is a chained plugin: it needs the main plugin's result (prevResult); put it after a plugin such as skein or bridge in a conflist", "")
	}
	return &c, nil
}

// Lease returns the configured lease time.
func (c *NetConf) Lease() time.Duration {
	if c.LeaseSeconds == 0 {
		return DefaultLease
	}
	return time.Duration(c.LeaseSeconds) * time.Second
}

// Route is one route served to a VM. An invalid Via means on-link.
type Route struct {
	Dst netip.Prefix `json:"dst"`
	Via netip.Addr   `json:"via,omitzero"`
}

func (r Route) String() string {
	if !r.Via.IsValid() {
		return r.Dst.String() + " on-link"
	}
	return r.Dst.String() + " via " + r.Via.String()
}

// Lease is exactly what the DHCP server hands one VM interface: the part of
// the main plugin's result that belongs to that interface. It is pure data,
// stored with the attachment so a restarted skeind serves the same thing.
type Lease struct {
	// IfName is the main plugin's interface in the pod (the veth that
	// becomes a bridge port).
	IfName string `json:"ifName"`
	// MAC is the address the main plugin's result promised for IfName;
	// the VM's NIC gets it, the veth a new one.
	MAC string `json:"mac"`
	// Addr4 and Addr6 are the addresses with the prefix the result gave
	// (skein: /32 and /128). Either may be invalid (not served).
	Addr4 netip.Prefix `json:"addr4,omitzero"`
	Addr6 netip.Prefix `json:"addr6,omitzero"`
	// Gateway4/6 are the IPConfig gateways (invalid: none).
	Gateway4 netip.Addr `json:"gateway4,omitzero"`
	Gateway6 netip.Addr `json:"gateway6,omitzero"`
	// Routes4/6 are the result's routes for this interface, gateways
	// resolved (a route without one uses the interface's gateway).
	Routes4 []Route `json:"routes4,omitempty"`
	Routes6 []Route `json:"routes6,omitempty"`
	// DNS from the result.
	DNS4     []netip.Addr `json:"dns4,omitempty"`
	DNS6     []netip.Addr `json:"dns6,omitempty"`
	Search   []string     `json:"search,omitempty"`
	Domain   string       `json:"domain,omitempty"`
	Hostname string       `json:"hostname,omitempty"`
	// MTU of the veth at ADD (served as option 26 / the RA MTU option).
	MTU int `json:"mtu,omitempty"`
	// Time is the lease time; T1 = Time/2, T2 = Time*7/8.
	Time time.Duration `json:"time"`
}

// HWAddr is MAC parsed (nil if malformed, which Leases never produces).
func (l *Lease) HWAddr() net.HardwareAddr {
	m, _ := net.ParseMAC(l.MAC)
	return m
}

// Router4 is the router option (3): the gateway of the result's IPv4
// default route, if it has one.
func (l *Lease) Router4() netip.Addr {
	for _, r := range l.Routes4 {
		if r.Dst.Bits() == 0 && r.Via.IsValid() {
			return r.Via
		}
	}
	return netip.Addr{}
}

// Classless4 is what option 121 carries, or nil when the router option is
// enough. RFC 3442 makes a client that gets option 121 ignore option 3,
// so when 121 is sent it holds every route, the default one included.
//
// skein's addresses are /32 with the gateway 169.254.1.1 outside them: a
// VM told "10.64.0.5/32, router 169.254.1.1" could not reach its router.
// A gateway outside the served prefix therefore gets an on-link host
// route (router 0.0.0.0, which clients read as "directly reachable"),
// listed first so the routes through it can be installed after it. The
// mask stays the one the result gave, so the VM sees the same address the
// container would have seen.
func (l *Lease) Classless4() []Route {
	if !l.Addr4.IsValid() {
		return nil
	}
	onlink := map[netip.Addr]bool{}
	var out []Route
	for _, r := range l.Routes4 {
		if r.Via.IsValid() && !l.Addr4.Masked().Contains(r.Via) && !onlink[r.Via] {
			onlink[r.Via] = true
			out = append(out, Route{Dst: netip.PrefixFrom(r.Via, 32)})
		}
	}
	onlyDefault := len(l.Routes4) == 1 && l.Routes4[0].Dst.Bits() == 0 && l.Routes4[0].Via.IsValid()
	if len(out) == 0 && (len(l.Routes4) == 0 || onlyDefault) {
		return nil
	}
	return append(out, l.Routes4...)
}

// T1 and T2 are the renewal and rebinding times.
func (l *Lease) T1() time.Duration { return l.Time / 2 }
func (l *Lease) T2() time.Duration { return l.Time * 7 / 8 }

// AdoptLegacyPrev makes a 0.1.0 or 0.2.0 prevResult usable by Leases.
// Such a result names no interface (only "ip4" and "ip6"); its addresses
// are those of the interface the runtime named, CNI_IFNAME, in the
// sandbox, and AdoptLegacyPrev says so: it replaces conf.PrevResult with a
// current result that lists ifName in sandbox and gives it every address.
// Results of later versions are left alone.
func AdoptLegacyPrev(conf *NetConf, ifName, sandbox string) error {
	if conf.PrevResult == nil || !cni.LegacyResult(conf.CNIVersion) {
		return nil
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	if len(prev.Interfaces) > 0 {
		return nil
	}
	prev.Interfaces = []*current.Interface{{Name: ifName, Sandbox: sandbox}}
	for _, ip := range prev.IPs {
		ip.Interface = current.Int(0)
	}
	conf.PrevResult = prev
	return nil
}

// Leases picks from the main plugin's result every interface it made in
// the sandbox that carries addresses, and what to serve on each. At most
// one address per family is served on an interface (DHCPv4 has room for
// one; further ones are reported as an error rather than dropped
// silently). hostname may be "" (no option 12).
func Leases(conf *NetConf, hostname string) ([]Lease, error) {
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	byIf := map[int]*Lease{}
	var order []int
	for _, ip := range prev.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(prev.Interfaces) {
			continue
		}
		idx := *ip.Interface
		itf := prev.Interfaces[idx]
		if itf.Sandbox == "" {
			continue
		}
		l := byIf[idx]
		if l == nil {
			if err := cni.ValidateIfName(itf.Name); err != nil {
				return nil, types.NewError(types.ErrInvalidNetworkConfig, "prevResult: "+err.Error(), "")
			}
			l = &Lease{IfName: itf.Name, Time: conf.Lease(), Hostname: hostname}
			if itf.Mac != "" {
				mac, err := net.ParseMAC(itf.Mac)
				if err != nil || len(mac) != 6 {
					return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: interface %s has MAC %q, not an Ethernet address", itf.Name, itf.Mac), "")
				}
				l.MAC = mac.String()
			}
			byIf[idx] = l
			order = append(order, idx)
		}
		addr, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: bad address %v", ip.Address), "")
		}
		addr = addr.Unmap()
		ones, bits := ip.Address.Mask.Size()
		if bits != addr.BitLen() {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: address %v has a mask of the wrong family", ip.Address.String()), "")
		}
		p := netip.PrefixFrom(addr, ones)
		gw, _ := netip.AddrFromSlice(ip.Gateway)
		gw = gw.Unmap()
		if gw.IsValid() && gw.Is4() != addr.Is4() {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: gateway %s of %s is of the other family", gw, p), "")
		}
		dst, dgw := &l.Addr4, &l.Gateway4
		if addr.Is6() {
			dst, dgw = &l.Addr6, &l.Gateway6
		}
		if dst.IsValid() {
			return nil, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("prevResult gives interface %s two addresses of one family (%s and %s); a VM NIC is served one per family", l.IfName, *dst, p), "")
		}
		*dst, *dgw = p, gw
	}
	if len(order) == 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			"prevResult has no interface inside the sandbox with an IPv4 or IPv6 address: nothing for skein-vm to hand to a VM", "")
	}
	leases := make([]Lease, 0, len(order))
	for _, idx := range order {
		leases = append(leases, *byIf[idx])
	}
	if err := assignRoutes(leases, prev.Routes); err != nil {
		return nil, err
	}
	dns := prev.DNS
	if dns.IsEmpty() {
		dns = conf.DNS
	}
	for i := range leases {
		if err := setDNS(&leases[i], dns); err != nil {
			return nil, err
		}
	}
	return leases, nil
}

// assignRoutes gives each route of the result to an interface: the one
// whose prefix holds its gateway, else the one whose gateway it names,
// else (no gateway: the interface gateway is implied) the first interface
// of that family.
func assignRoutes(leases []Lease, routes []*types.Route) error {
	for _, r := range routes {
		if r == nil {
			continue
		}
		dst, ok := prefixOf(r.Dst)
		if !ok {
			return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: bad route destination %v", r.Dst.String()), "")
		}
		v6 := dst.Addr().Is6()
		gw, _ := netip.AddrFromSlice(r.GW)
		gw = gw.Unmap()
		if gw.IsValid() && gw.Is6() != v6 {
			return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: route %s via %s mixes families", dst, gw), "")
		}
		target := -1
		for i := range leases {
			addr, lgw := leases[i].Addr4, leases[i].Gateway4
			if v6 {
				addr, lgw = leases[i].Addr6, leases[i].Gateway6
			}
			if !addr.IsValid() {
				continue
			}
			if target < 0 {
				target = i
			}
			if gw.IsValid() && (gw == lgw || addr.Masked().Contains(gw)) {
				target = i
				break
			}
		}
		if target < 0 {
			continue // a route of a family no sandbox interface has
		}
		l := &leases[target]
		via := gw
		if !via.IsValid() {
			via = l.Gateway4
			if v6 {
				via = l.Gateway6
			}
		}
		rt := Route{Dst: dst, Via: via}
		if v6 {
			l.Routes6 = append(l.Routes6, rt)
		} else {
			l.Routes4 = append(l.Routes4, rt)
		}
	}
	return nil
}

func prefixOf(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, bits := n.Mask.Size()
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func setDNS(l *Lease, dns types.DNS) error {
	for _, s := range dns.Nameservers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("DNS nameserver %q is not an IP address", s), "")
		}
		if a = a.Unmap(); a.Is4() {
			l.DNS4 = append(l.DNS4, a)
		} else {
			l.DNS6 = append(l.DNS6, a)
		}
	}
	for _, s := range dns.Search {
		d, err := normalizeDomain(s)
		if err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, "DNS search domain: "+err.Error(), "")
		}
		l.Search = append(l.Search, d)
	}
	if dns.Domain != "" {
		d, err := normalizeDomain(dns.Domain)
		if err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, "DNS domain: "+err.Error(), "")
		}
		l.Domain = d
	}
	return nil
}

// normalizeDomain drops one trailing dot and checks RFC 1035 limits:
// labels of 1-63 bytes, 253 bytes in all, no control characters.
func normalizeDomain(s string) (string, error) {
	d := strings.TrimSuffix(s, ".")
	if d == "" || len(d) > 253 {
		return "", fmt.Errorf("%q is not a domain name (1-253 bytes)", s)
	}
	for _, label := range strings.Split(d, ".") {
		if len(label) == 0 || len(label) > 63 {
			return "", fmt.Errorf("%q has an empty label or one longer than 63 bytes", s)
		}
		for _, c := range []byte(label) {
			if c <= ' ' || c >= 0x7f {
				return "", fmt.Errorf("%q contains a space or a non-ASCII byte", s)
			}
		}
	}
	return d, nil
}

// HostnameFromArgs returns the hostname a runtime passes in CNI_ARGS
// (K8S_POD_NAME), or "" if none or if it is not a valid host name.
func HostnameFromArgs(args string) string {
	kv, err := cni.ParseArgs(args)
	if err != nil {
		return ""
	}
	h := kv["K8S_POD_NAME"]
	if h == "" || len(h) > 253 {
		return ""
	}
	for i, c := range h {
		inner := i > 0 && i < len(h)-1
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || (c == '-' || c == '.') && inner
		if !ok {
			return ""
		}
	}
	return h
}
