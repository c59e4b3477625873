package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/skeinnet/skein/internal/cnispec"
)

// SupportedVersions are the spec versions skein accepts: every version
// the spec has had. Results are produced in whichever of them the
// configuration names; a configuration without cniVersion is 0.1.0, as the
// spec and libcni read it. Which verbs a version has (CHECK from 0.4.0,
// GC and STATUS from 1.1.0) the plugin binaries enforce, before skeind is
// called.
var SupportedVersions = cnispec.Versions

// LegacyResult reports whether results of spec version v have the shape
// of 0.1.0 and 0.2.0: {"ip4", "ip6", "dns"}, one address per family, no
// interfaces.
func LegacyResult(v string) bool { return v == "0.1.0" || v == "0.2.0" }

// DefaultPool serves networks that name none.
const DefaultPool = "default"

// NetConf is skein's network configuration: the spec's fields plus
// skein's own. Zero values: Pool "" means DefaultPool, MTU 0 means the
// node's uplink MTU, Socket "" means the default skeind socket.
type NetConf struct {
	types.PluginConf

	// Pool names the address pool (admins decide who may use which).
	Pool string `json:"pool,omitempty"`
	// MTU of the pod interface; 0 = the node's uplink MTU.
	MTU int `json:"mtu,omitempty"`
	// Socket is skeind's gRPC socket; read by the skein binary only.
	Socket string `json:"socket,omitempty"`

	RuntimeConfig struct {
		// IPs is the "ips" capability: static addresses, with or
		// without a prefix length.
		IPs []string `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// Args is the conventional "args" field; skein reads args.cni.ips.
	Args struct {
		CNI struct {
			IPs []string `json:"ips,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`
}

// Parse decodes and validates a network configuration. Errors are
// *types.Error with the spec's codes.
func Parse(data []byte) (*NetConf, error) {
	var c NetConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode network configuration: "+err.Error(), "")
	}
	if c.CNIVersion == "" {
		c.CNIVersion = "0.1.0" // the spec's reading of a missing cniVersion
	}
	if !slices.Contains(SupportedVersions, c.CNIVersion) {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("cniVersion %q is not supported", c.CNIVersion),
			"skein supports "+strings.Join(SupportedVersions, ", "))
	}
	if err := ValidateNetworkName(c.Name); err != nil {
		return nil, err
	}
	if c.Pool == "" {
		c.Pool = DefaultPool
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mtu %d out of range 68-65535", c.MTU), "")
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "cannot decode prevResult: "+err.Error(), "")
		}
		if err := CheckPrevResult(c.PrevResult); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// ValidateNetworkName checks a configuration's "name" as the spec defines
// it: alphanumerics, '_', '.', '-', the first character alphanumeric;
// bounded so the kernel tag fits. The error is a *types.Error with code 7
// (invalid network configuration). Every front door that takes a CNI
// configuration checks the name with it.
func ValidateNetworkName(n string) error {
	var err error
	switch {
	case n == "":
		err = errors.New("network configuration has no \"name\"")
	case len(n) > 128:
		err = fmt.Errorf("network name %q is longer than 128 bytes", n)
	default:
		err = validID("network name", n)
	}
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	return nil
}

func validID(what, s string) error {
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return fmt.Errorf("%s %q: only letters, digits, '_', '.' and '-' allowed, starting with a letter or digit", what, s)
		}
	}
	return nil
}

// ValidateContainerID checks CNI_CONTAINERID as the spec defines it.
func ValidateContainerID(id string) error {
	if id == "" {
		return errors.New("CNI_CONTAINERID is empty")
	}
	if len(id) > 256 {
		return fmt.Errorf("CNI_CONTAINERID is longer than 256 bytes")
	}
	return validID("CNI_CONTAINERID", id)
}

// ValidateIfName checks an interface name (CNI_IFNAME, a pod network's
// interface) as the kernel and the spec require. A '%' is refused too: the
// kernel takes a name holding one as a template ("net%d") and makes up
// another name, so the interface would not be the one asked for.
func ValidateIfName(n string) error {
	switch {
	case n == "":
		return errors.New("interface name is empty")
	case len(n) > 15:
		return fmt.Errorf("interface name %q is longer than 15 bytes", n)
	case n == "." || n == "..":
		return fmt.Errorf("interface name %q is not allowed", n)
	}
	for _, c := range n {
		if c == '/' || c == ':' || c == '%' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("interface name %q contains '/', ':', '%%', whitespace or a control character", n)
		}
	}
	return nil
}

// StaticIPs collects the static addresses asked for through the "ips"
// capability, args.cni.ips and CNI_ARGS IP=. Duplicates are folded.
func StaticIPs(c *NetConf, cniArgs string) ([]netip.Addr, error) {
	var raw []string
	raw = append(raw, c.RuntimeConfig.IPs...)
	raw = append(raw, c.Args.CNI.IPs...)
	kv, err := ParseArgs(cniArgs)
	if err != nil {
		return nil, err
	}
	if v := kv["IP"]; v != "" {
		raw = append(raw, strings.Split(v, ",")...)
	}
	var out []netip.Addr
	var have4, have6 bool
	for _, s := range raw {
		s = strings.TrimSpace(s)
		a, err := parseIPMaybePrefix(s)
		if err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid static address %q", s), "")
		}
		if slices.Contains(out, a) {
			continue
		}
		if a.Is4() && have4 || a.Is6() && have6 {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "at most one static address per family", fmt.Sprint(raw))
		}
		have4 = have4 || a.Is4()
		have6 = have6 || a.Is6()
		out = append(out, a)
	}
	return out, nil
}

func parseIPMaybePrefix(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Addr().Unmap(), err
	}
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err
}

// ParseArgs parses CNI_ARGS ("K=V;K2=V2").
func ParseArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %q is not KEY=VALUE", pair), "")
		}
		out[k] = v
	}
	return out, nil
}

// ipNet is a helper for results: addr with a host-length mask.
func hostNet(a netip.Addr) net.IPNet {
	return net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}
